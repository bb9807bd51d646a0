//! The recent calls on a sandbox, kept by its actor (in memory, newest last)
//! so that a person can see what an agent did with it.

use crate::moment;
use std::collections::VecDeque;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// Calls kept per sandbox.
const KEPT: usize = 50;
/// Characters of code or command shown per call.
const SUMMARY_CHARS: usize = 120;
/// Characters of an outcome kept per call: an error's text may come from
/// the sandbox's own program, and every one of the kept calls holds one.
const OUTCOME_CHARS: usize = 240;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallKind {
    Python,
    Shell,
    Install,
    Upload,
    Restart,
    ResetPython,
    Snapshot,
    /// A call on its background processes.
    Process,
    /// Put to sleep on disk on request.
    Hibernate,
}

/// One call, as the history shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CallRecord {
    #[serde(with = "crate::moment")]
    pub started_at: OffsetDateTime,
    pub kind: CallKind,
    /// What was asked: the code's first line, the command, the package.
    pub summary: String,
    /// How it ended, in a few words ("exit 0", "timed out", "failed").
    pub outcome: String,
    pub ok: bool,
    pub duration_ms: u64,
}

impl CallRecord {
    /// A call that started at `started_at` and ends now.
    pub fn ended(started_at: OffsetDateTime, kind: CallKind, summary: &str, ok: bool, outcome: String) -> Self {
        let duration_ms = (moment::now() - started_at).whole_milliseconds().max(0) as u64;
        Self {
            started_at,
            kind,
            summary: summarise(summary),
            outcome: cut(&outcome, OUTCOME_CHARS),
            ok,
            duration_ms,
        }
    }
}

/// The first non-blank line, cut to a readable length.
fn summarise(text: &str) -> String {
    let first = text.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
    let mut out = cut(first, SUMMARY_CHARS);
    if text.trim().lines().count() > 1 && !out.ends_with(" …") {
        out.push_str(" …");
    }
    out
}

/// At most `chars` characters of `text`, marked when cut.
fn cut(text: &str, chars: usize) -> String {
    let mut out: String = text.chars().take(chars).collect();
    if text.chars().nth(chars).is_some() {
        out.push_str(" …");
    }
    out
}

#[derive(Debug, Default)]
pub struct History {
    calls: VecDeque<CallRecord>,
}

impl History {
    pub fn push(&mut self, call: CallRecord) {
        if self.calls.len() == KEPT {
            self.calls.pop_front();
        }
        self.calls.push_back(call);
    }

    pub fn to_vec(&self) -> Vec<CallRecord> {
        self.calls.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_show_the_first_line_and_mark_the_rest() {
        assert_eq!(summarise("print(1)"), "print(1)");
        assert_eq!(summarise("\n  import os\nprint(2)\n"), "import os …");
        let long = "x".repeat(500);
        assert_eq!(summarise(&long).chars().count(), SUMMARY_CHARS + 2);
    }

    #[test]
    fn outcomes_are_cut_whatever_the_agent_said() {
        let said = format!("error: {}", "é".repeat(5 << 20));
        let call = CallRecord::ended(moment::now(), CallKind::Python, "x", false, said);
        assert_eq!(call.outcome.chars().count(), OUTCOME_CHARS + 2);
        assert!(call.outcome.starts_with("error: éé") && call.outcome.ends_with(" …"));
        let short = CallRecord::ended(moment::now(), CallKind::Shell, "x", true, "exit 0".into());
        assert_eq!(short.outcome, "exit 0");
    }

    #[test]
    fn only_the_most_recent_calls_are_kept() {
        let mut h = History::default();
        for i in 0..KEPT + 5 {
            h.push(CallRecord::ended(
                moment::now(),
                CallKind::Shell,
                &i.to_string(),
                true,
                "exit 0".into(),
            ));
        }
        let kept = h.to_vec();
        assert_eq!(kept.len(), KEPT);
        assert_eq!(kept[0].summary, "5");
        assert_eq!(kept.last().unwrap().summary, (KEPT + 4).to_string());
    }
}
