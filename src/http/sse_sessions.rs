//! The open sessions of the legacy SSE transport ([`crate::http::sse`]): each
//! one's inbox, the caller that opened it, and its place in
//! [`crate::access::sessions::Sessions`]. The session id, given only to whoever
//! opened the stream, is the capability to post to it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::model::ClientJsonRpcMessage;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::access::caller::Caller;
use crate::access::sessions::Ticket;

struct Session {
    inbox: mpsc::Sender<ClientJsonRpcMessage>,
    caller: Caller,
    /// Activity of the session, for its idle limit.
    ticket: Arc<Ticket>,
}

#[derive(Clone, Default)]
pub struct SseSessions {
    inner: Arc<Mutex<HashMap<String, Session>>>,
}

/// Removes the session and stops its service when the event stream ends.
pub struct SessionGuard {
    id: String,
    sessions: SseSessions,
    stop: CancellationToken,
}

impl SseSessions {
    /// The caller that opened session `id`, if it is open.
    pub fn caller_of(&self, id: &str) -> Option<Caller> {
        self.inner
            .lock()
            .expect("sessions lock")
            .get(id)
            .map(|s| s.caller.clone())
    }

    /// Opens session `id` of `caller`, whose messages go to `inbox`.
    pub fn insert(&self, id: String, inbox: mpsc::Sender<ClientJsonRpcMessage>, caller: Caller, ticket: Arc<Ticket>) {
        let session = Session { inbox, caller, ticket };
        self.inner.lock().expect("sessions lock").insert(id, session);
    }

    /// Session `id` stays open until the guard is dropped, which also
    /// cancels `stop`.
    pub fn guard(&self, id: String, stop: CancellationToken) -> SessionGuard {
        SessionGuard {
            id,
            sessions: self.clone(),
            stop,
        }
    }

    /// The inbox and ticket of session `id`, if it is open and, when the
    /// request names a caller, that caller opened it.
    pub fn inbox(
        &self,
        id: &str,
        caller: Option<&Caller>,
    ) -> Option<(mpsc::Sender<ClientJsonRpcMessage>, Arc<Ticket>)> {
        let sessions = self.inner.lock().expect("sessions lock");
        match sessions.get(id) {
            Some(s) if caller.is_none_or(|c| *c == s.caller) => Some((s.inbox.clone(), s.ticket.clone())),
            _ => None,
        }
    }
}

/// The `sessionId` of a `/messages` query, percent-decoded. The request
/// guard (which charges the message to the session's tenant) and the
/// handler both read it here, so they cannot disagree on which session a
/// message names.
pub fn session_id(query: Option<&str>) -> Option<String> {
    query?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        matches!(k, "sessionId" | "session_id")
            .then(|| percent_encoding::percent_decode_str(v).decode_utf8_lossy().into_owned())
    })
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.sessions.inner.lock().expect("sessions lock").remove(&self.id);
        self.stop.cancel();
        debug!(session = %self.id, "SSE session closed");
    }
}

#[cfg(test)]
mod tests {
    use super::session_id;

    #[test]
    fn the_session_id_is_read_decoded_whoever_reads_it() {
        assert_eq!(session_id(Some("sessionId=ab12")).as_deref(), Some("ab12"));
        assert_eq!(session_id(Some("x=1&session_id=%61b12")).as_deref(), Some("ab12"));
        assert_eq!(session_id(Some("other=1")), None);
        assert_eq!(session_id(None), None);
    }
}
