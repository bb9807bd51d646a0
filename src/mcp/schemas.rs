//! Tool schemas that every client takes. The derived schemas say "optional"
//! as a type array (`["string", "null"]`) or an `anyOf` with `null`, and
//! give integers formats such as `uint32`: Gemini's and OpenAPI-style
//! function calling reject type arrays, and JSON Schema validators warn of
//! formats they do not know, on every call. So, as tools are listed:
//! - in an input schema, an optional argument is one that is not required:
//!   its `null` goes, and it keeps its one type (or its one `$ref`);
//! - in an output schema, where `null` is a value a result may hold, a
//!   type array becomes an `anyOf` of one type each;
//! - formats JSON Schema does not define are dropped (the bounds stay:
//!   `minimum: 0` says as much as `uint64`).

use std::sync::{Arc, OnceLock};

use rmcp::model::Tool;
use serde_json::{Map, Value};

/// The formats JSON Schema (2020-12) defines.
const STANDARD_FORMATS: &[&str] = &[
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

/// Which side of a tool a schema describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Input,
    Output,
}

/// The tools `list` gives, their schemas made portable once: every
/// session's router lists the same tools, so the rewrite is not made again
/// for each.
pub(crate) fn portable_tools(list: impl FnOnce() -> Vec<Tool>) -> Vec<Tool> {
    static TOOLS: OnceLock<Vec<Tool>> = OnceLock::new();
    TOOLS
        .get_or_init(|| {
            let mut tools = list();
            for tool in &mut tools {
                make_portable(Arc::make_mut(&mut tool.input_schema), Side::Input);
                if let Some(output) = &mut tool.output_schema {
                    make_portable(Arc::make_mut(output), Side::Output);
                }
            }
            tools
        })
        .clone()
}

/// Rewrites `schema` (and every schema inside it) as the module says.
fn make_portable(schema: &mut Map<String, Value>, side: Side) {
    if let Some(Value::Array(types)) = schema.get("type") {
        let one: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
        let nullable = one.len() < types.len();
        match (side, one.len()) {
            (Side::Input, 1) => drop(schema.insert("type".into(), one[0].clone())),
            _ => {
                schema.remove("type");
                let mut each: Vec<Value> = one.into_iter().map(|t| Value::Object(single("type", t))).collect();
                if nullable {
                    each.push(Value::Object(single("type", "null".into())));
                }
                schema.insert("anyOf".into(), Value::Array(each));
            }
        }
    }
    if side == Side::Input {
        if let Some(Value::Array(branches)) = schema.get("anyOf") {
            let kept: Vec<&Value> = branches
                .iter()
                .filter(|b| b.get("type") != Some(&"null".into()))
                .collect();
            if kept.len() == 1 && kept.len() < branches.len() {
                if let Value::Object(branch) = kept[0].clone() {
                    schema.remove("anyOf");
                    for (k, v) in branch {
                        schema.entry(k).or_insert(v);
                    }
                }
            }
        }
    }
    if schema
        .get("format")
        .and_then(Value::as_str)
        .is_some_and(|f| !STANDARD_FORMATS.contains(&f))
    {
        schema.remove("format");
    }
    for value in schema.values_mut() {
        walk(value, side);
    }
}

fn walk(value: &mut Value, side: Side) {
    match value {
        Value::Object(inner) => make_portable(inner, side),
        Value::Array(items) => items.iter_mut().for_each(|v| walk(v, side)),
        _ => {}
    }
}

fn single(key: &str, value: Value) -> Map<String, Value> {
    let mut map = Map::new();
    map.insert(key.into(), value);
    map
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn portable(mut schema: Value, side: Side) -> Value {
        make_portable(schema.as_object_mut().unwrap(), side);
        schema
    }

    #[test]
    fn optional_arguments_keep_one_type_and_unknown_formats_go() {
        let input = json!({"type": "object", "properties": {
            "timeout_seconds": {"type": ["integer", "null"], "format": "uint64", "minimum": 0},
            "egress": {"anyOf": [{"$ref": "#/$defs/Egress"}, {"type": "null"}], "description": "d"},
            "when": {"type": "string", "format": "date-time"},
        }});
        let out = portable(input, Side::Input);
        assert_eq!(
            out["properties"]["timeout_seconds"],
            json!({"type": "integer", "minimum": 0})
        );
        assert_eq!(
            out["properties"]["egress"],
            json!({"$ref": "#/$defs/Egress", "description": "d"})
        );
        assert_eq!(out["properties"]["when"]["format"], "date-time");
    }

    #[test]
    fn nullable_results_become_an_any_of_without_type_arrays() {
        let output = json!({"$defs": {"Image": {"properties": {
            "height": {"type": "integer", "format": "uint32"},
            "notice": {"type": ["string", "null"]},
        }}}});
        let out = portable(output, Side::Output);
        let image = &out["$defs"]["Image"]["properties"];
        assert_eq!(image["height"], json!({"type": "integer"}));
        assert_eq!(
            image["notice"],
            json!({"anyOf": [{"type": "string"}, {"type": "null"}]})
        );
    }
}
