//! Streamable HTTP sessions under the server's caps: a [`SessionManager`]
//! around rmcp's own that takes a place in [`Sessions`] for each session it
//! creates, marks the session busy while a call's response stream is open,
//! and closes it when the registry says so (idle, key expired).
//!
//! rmcp does not tell a session manager who asks; the `/mcp` route runs
//! rmcp inside [`opened_by`], in a task-local naming the caller, so that
//! `create_session` can charge the right tenant and record a refusal that
//! the route then answers as 429/503 (rmcp itself would say 500).
//!
//! A session is its opener's tenant's, on every request that names it: to
//! any other caller it does not exist (rmcp answers 404 to a message, a
//! stream or a resume, and a `DELETE` closes nothing), so a session id seen
//! by someone else replays no response and ends no stream.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use futures_util::{Stream, StreamExt};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::{RestoreOutcome, ServerSseMessage};
use rmcp::transport::streamable_http_server::{SessionId, SessionManager};

use crate::access::caller::Caller;
use crate::access::sessions::{Sessions, Ticket};
use crate::metrics::SessionRefusal;

/// Who is opening sessions in this request, and whether one was refused.
#[derive(Clone)]
struct Opener {
    caller: Option<Caller>,
    refused: Arc<Mutex<Option<SessionRefusal>>>,
}

tokio::task_local! {
    /// The caller of the `/mcp` request being served.
    static OPENER: Opener;
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError<E: std::error::Error> {
    #[error(transparent)]
    Refused(SessionRefusal),
    #[error("a session can only be opened through the /mcp route")]
    NoCaller,
    #[error("no such session")]
    NotYours,
    #[error(transparent)]
    Inner(E),
}

struct Shared<M> {
    inner: M,
    sessions: Sessions,
    /// Each open session's place under the caps, and its tenant.
    tickets: Mutex<HashMap<SessionId, (Ticket, String)>>,
}

/// rmcp's session manager `M`, counted and expired by [`Sessions`].
pub struct CappedSessions<M> {
    shared: Arc<Shared<M>>,
}

impl<M> CappedSessions<M> {
    pub fn new(inner: M, sessions: Sessions) -> Self {
        Self {
            shared: Arc::new(Shared {
                inner,
                sessions,
                tickets: Mutex::default(),
            }),
        }
    }
}

/// Who asks about a session: the tenant of the `/mcp` request being
/// served (none when it has no caller), or the server itself (rmcp's own
/// session worker, which closes a session whose transport ended, runs
/// outside any request).
enum Requester {
    Request(Option<String>),
    Server,
}

fn requester() -> Requester {
    match OPENER.try_with(|o| o.caller.as_ref().map(|c| c.owner.clone())) {
        Ok(owner) => Requester::Request(owner),
        Err(_) => Requester::Server,
    }
}

impl<M: SessionManager> Shared<M> {
    fn touch(&self, id: &SessionId) {
        if let Some((t, _)) = self.tickets.lock().expect("tickets lock").get(id) {
            t.touch();
        }
    }

    fn busy(&self, id: &SessionId) -> Option<crate::access::sessions::Busy> {
        self.tickets
            .lock()
            .expect("tickets lock")
            .get(id)
            .map(|(t, _)| t.busy())
    }

    /// Whether the session `id` is the requesting tenant's (the server's
    /// own calls reach every session).
    fn owned(&self, id: &SessionId) -> bool {
        let owner = self
            .tickets
            .lock()
            .expect("tickets lock")
            .get(id)
            .map(|(_, o)| o.clone());
        match requester() {
            Requester::Server => true,
            Requester::Request(asking) => owner.is_some_and(|owner| asking.as_deref() == Some(owner.as_str())),
        }
    }

    /// An error unless the session `id` is the requesting tenant's.
    fn check<E: std::error::Error>(&self, id: &SessionId) -> Result<(), SessionError<E>> {
        match self.owned(id) {
            true => Ok(()),
            false => Err(SessionError::NotYours),
        }
    }
}

impl<M: SessionManager> SessionManager for CappedSessions<M> {
    type Error = SessionError<M::Error>;
    type Transport = M::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let opener = OPENER.try_with(Clone::clone).ok();
        let Some(Opener {
            caller: Some(caller),
            refused,
        }) = opener
        else {
            return Err(SessionError::NoCaller);
        };
        let ticket = match self.shared.sessions.open(&caller) {
            Ok(t) => t,
            Err(r) => {
                *refused.lock().expect("opener lock") = Some(r);
                return Err(SessionError::Refused(r));
            }
        };
        let (id, transport) = self.shared.inner.create_session().await.map_err(SessionError::Inner)?;
        let closed = ticket.closed();
        self.shared
            .tickets
            .lock()
            .expect("tickets lock")
            .insert(id.clone(), (ticket, caller.owner.clone()));
        // Closed by the registry (or after a normal close, a no-op).
        let shared = self.shared.clone();
        let watched = id.clone();
        tokio::spawn(async move {
            closed.await;
            let _ = shared.inner.close_session(&watched).await;
            shared.tickets.lock().expect("tickets lock").remove(&watched);
        });
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.shared.check(id)?;
        let _busy = self.shared.busy(id);
        self.shared
            .inner
            .initialize_session(id, message)
            .await
            .map_err(SessionError::Inner)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        if !self.shared.owned(id) {
            return Ok(false);
        }
        self.shared.inner.has_session(id).await.map_err(SessionError::Inner)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        // Another tenant's `DELETE` closes nothing (and says no more than
        // the `DELETE` of an unknown id).
        if !self.shared.owned(id) {
            return Ok(());
        }
        let ticket = self.shared.tickets.lock().expect("tickets lock").remove(id);
        drop(ticket);
        self.shared.inner.close_session(id).await.map_err(SessionError::Inner)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.shared.check(id)?;
        // The call runs until its response stream ends.
        let busy = self.shared.busy(id);
        let stream = self
            .shared
            .inner
            .create_stream(id, message)
            .await
            .map_err(SessionError::Inner)?;
        Ok(stream.map(move |m| {
            let _running = &busy;
            m
        }))
    }

    async fn accept_message(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<(), Self::Error> {
        self.shared.check(id)?;
        self.shared.touch(id);
        self.shared
            .inner
            .accept_message(id, message)
            .await
            .map_err(SessionError::Inner)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.shared.check(id)?;
        // A stream held open for notifications is not activity.
        self.shared
            .inner
            .create_standalone_stream(id)
            .await
            .map_err(SessionError::Inner)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.shared.check(id)?;
        self.shared.touch(id);
        self.shared
            .inner
            .resume(id, last_event_id)
            .await
            .map_err(SessionError::Inner)
    }

    async fn restore_session(&self, _id: SessionId) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        // Sessions live in this process only; an unknown id is a 404.
        Ok(RestoreOutcome::NotSupported)
    }
}

/// Runs `call` (rmcp serving a `/mcp` request) as `caller`'s: the sessions
/// it opens are charged to `caller`. Also says why a session was refused,
/// if one was.
pub async fn opened_by<F: Future>(caller: Option<Caller>, call: F) -> (F::Output, Option<SessionRefusal>) {
    let opener = Opener {
        caller,
        refused: Arc::default(),
    };
    let refused = opener.refused.clone();
    let output = OPENER.scope(opener, call).await;
    let refused = *refused.lock().expect("opener lock");
    (output, refused)
}
