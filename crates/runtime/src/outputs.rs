//! What a Python run shows besides its printed text, as the agent reports
//! it (`docker/outputs.py` makes them): the last expression's value, what
//! `display()` was given and the figures shown, in order; and an uncaught
//! exception as data. The agent is the sandbox's, so everything here is
//! bounded again on arrival ([`Output::sanitised`], [`RunError::sanitised`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::agent::{bounded, RESULTS_IN_CONTAINER};

/// Most outputs kept from one run (the agent keeps 32 and a note).
pub const MAX_OUTPUTS: usize = 33;
/// Longest message and traceback of an error kept (the agent's bounds,
/// with room for the UTF-8 of a cut character).
const MAX_ERROR_VALUE: usize = 2048 + 8;
const MAX_ERROR_TRACEBACK: usize = 8192 + 8;
/// Longest path of an image output (Linux's `PATH_MAX`).
const MAX_PATH_BYTES: usize = 4096;

/// What one output holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OutputKind {
    /// A `repr`, or a note of the agent's.
    Text,
    /// Markdown: a DataFrame's table, `_repr_markdown_`, `_repr_latex_`.
    Markdown,
    /// `_repr_html_` of an object whose repr says nothing.
    Html,
    /// `_repr_json_`, as JSON text.
    Json,
    /// A file under the results folder: a figure, `_repr_png_`, `_repr_svg_`.
    Image,
}

/// One output of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Output {
    #[serde(rename = "type")]
    pub kind: OutputKind,
    /// The text of a text, Markdown, HTML or JSON output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Where an image output's file is, in the sandbox (under /app/results/outputs/).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Bytes of the text, or of the image's file.
    #[serde(default)]
    pub bytes: u64,
    /// An image's size in pixels, read from its header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub height: Option<u32>,
    /// The value of the run's last expression (a notebook's `Out`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub main: bool,
    /// The text was cut to fit the run's output budget.
    #[serde(default, skip_serializing_if = "is_false")]
    pub cut: bool,
}

/// An uncaught exception of a run, beside the traceback in `stderr`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RunError {
    /// The exception's type, e.g. `KeyError`.
    pub name: String,
    /// Its message.
    pub value: String,
    /// The traceback of your code's frames only, its end kept when long.
    pub traceback: String,
}

fn is_false(b: &bool) -> bool {
    !b
}

impl Output {
    /// The output as a well-behaved agent sends it under `text_bound`
    /// bytes of text, or None: an image whose path is not a file beneath
    /// the results folder, or an output that is neither text nor image.
    pub(crate) fn sanitised(mut self, text_bound: usize) -> Option<Self> {
        match self.kind {
            OutputKind::Image => {
                let path = self.path.as_ref()?;
                let below = path.strip_prefix(&format!("{RESULTS_IN_CONTAINER}/"));
                let inside = path.len() <= MAX_PATH_BYTES
                    && below.is_some_and(|b| !b.split('/').any(|c| c == ".." || c == "." || c.is_empty()));
                if !inside {
                    return None;
                }
                self.text = None;
            }
            _ => {
                let text = self.text.take()?;
                if text.len() > text_bound {
                    self.cut = true;
                }
                let text = bounded(text, text_bound);
                self.bytes = text.len() as u64;
                self.text = Some(text);
                self.path = None;
                self.width = None;
                self.height = None;
            }
        }
        Some(self)
    }

    /// A run's outputs, each sanitised, at most [`MAX_OUTPUTS`], their texts
    /// within `text_bound` bytes together.
    pub(crate) fn sanitise_all(outputs: Vec<Self>, text_bound: usize) -> Vec<Self> {
        let mut left = text_bound;
        let mut kept = Vec::new();
        for output in outputs.into_iter().take(MAX_OUTPUTS) {
            if let Some(output) = output.sanitised(left) {
                left = left.saturating_sub(output.text.as_ref().map_or(0, String::len));
                kept.push(output);
            }
        }
        kept
    }
}

impl RunError {
    pub(crate) fn sanitised(self) -> Self {
        Self {
            name: bounded(self.name, 200),
            value: bounded(self.value, MAX_ERROR_VALUE),
            traceback: tail(self.traceback, MAX_ERROR_TRACEBACK),
        }
    }
}

/// The end of `text` within `max` bytes, on a character boundary, marked
/// when cut: a traceback's end says what was raised.
fn tail(text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("… {}", &text[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(kind: OutputKind, text: &str) -> Output {
        Output {
            kind,
            text: Some(text.into()),
            path: None,
            bytes: text.len() as u64,
            width: None,
            height: None,
            main: false,
            cut: false,
        }
    }

    fn image(path: &str) -> Output {
        Output {
            path: Some(path.into()),
            text: None,
            ..text(OutputKind::Image, "")
        }
    }

    #[test]
    fn images_outside_the_results_folder_are_dropped() {
        let kept = Output::sanitise_all(
            vec![
                image("/app/results/outputs/1.png"),
                image("/etc/passwd"),
                image("/app/results/../x.png"),
                image("/app/results//x.png"),
                Output {
                    path: None,
                    ..image("")
                },
            ],
            1024,
        );
        assert_eq!(kept, vec![image("/app/results/outputs/1.png")]);
    }

    #[test]
    fn texts_share_one_bound_and_say_when_cut() {
        let kept = Output::sanitise_all(
            vec![
                text(OutputKind::Markdown, &"a".repeat(600)),
                text(OutputKind::Text, &"b".repeat(600)),
                text(OutputKind::Json, "{}"),
            ],
            1000,
        );
        assert!(!kept[0].cut && kept[0].text.as_ref().unwrap().len() == 600);
        assert!(kept[1].cut && kept[1].bytes <= 400 + 4, "{:?}", kept[1].bytes);
        assert!(kept[2].cut && kept[2].text.as_deref() == Some(" …"));
        let many = Output::sanitise_all(vec![text(OutputKind::Text, "x"); 1000], 1 << 20);
        assert_eq!(many.len(), MAX_OUTPUTS);
    }

    #[test]
    fn an_error_is_bounded() {
        let e = RunError {
            name: "E".repeat(10_000),
            value: "v".repeat(1 << 20),
            traceback: "t".repeat(1 << 20),
        }
        .sanitised();
        assert!(e.name.len() <= 204 && e.value.len() <= MAX_ERROR_VALUE + 4);
        assert!(e.traceback.len() <= MAX_ERROR_TRACEBACK + 4);
        let last = "KeyError: 'ключ'";
        let e = RunError {
            name: "KeyError".into(),
            value: "'ключ'".into(),
            traceback: format!("{}{last}", "ж".repeat(10_000)),
        }
        .sanitised();
        assert!(e.traceback.ends_with(last), "the end of a traceback is kept");
        assert!(e.traceback.len() <= MAX_ERROR_TRACEBACK + 4);
    }
}
