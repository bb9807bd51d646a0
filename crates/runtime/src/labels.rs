//! Labels on every Docker object the project creates. They say which project
//! and which server made an object, so a server finds its own objects and
//! touches nothing else. Ownership by tenants is never a label: it lives in the
//! server's records, which no sandbox can write.

use std::collections::HashMap;

use uuid::Uuid;

pub const PROJECT: &str = "io.mcp-sandbox.project";
pub const PROJECT_VALUE: &str = "mcp-sandbox";
pub const SERVER: &str = "io.mcp-sandbox.server";
pub const SANDBOX: &str = "io.mcp-sandbox.sandbox";
/// The template an image was built for (`crate::template`); with
/// [`SERVER`], the server that built it, which alone removes it.
pub const TEMPLATE: &str = "io.mcp-sandbox.template";
/// The address the server gave an `open` sandbox on its bridge
/// (`sandbox_host::bridge`): its record of what it handed out, read back at start.
pub const ADDRESS: &str = "io.mcp-sandbox.address";

/// Labels for an object that belongs to one server.
pub fn for_server(server_id: &str) -> HashMap<String, String> {
    HashMap::from([
        (PROJECT.to_string(), PROJECT_VALUE.to_string()),
        (SERVER.to_string(), server_id.to_string()),
    ])
}

/// Labels for an object of one sandbox.
pub fn for_sandbox(server_id: &str, sandbox: Uuid) -> HashMap<String, String> {
    let mut labels = for_server(server_id);
    labels.insert(SANDBOX.to_string(), sandbox.to_string());
    labels
}

/// Docker `label=` filters selecting this server's objects.
pub fn server_filter(server_id: &str) -> HashMap<String, Vec<String>> {
    HashMap::from([(
        "label".to_string(),
        vec![format!("{PROJECT}={PROJECT_VALUE}"), format!("{SERVER}={server_id}")],
    )])
}

/// Docker `label=` filters selecting this server's objects of one sandbox.
pub fn sandbox_filter(server_id: &str, sandbox: Uuid) -> HashMap<String, Vec<String>> {
    let mut filters = server_filter(server_id);
    filters
        .entry("label".to_string())
        .or_default()
        .push(format!("{SANDBOX}={sandbox}"));
    filters
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_s_filter_narrows_the_server_s() {
        let sandbox = Uuid::new_v4();
        let filter = sandbox_filter("abc", sandbox);
        let mut labels = filter["label"].clone();
        labels.sort();
        let mut wanted = vec![
            format!("{PROJECT}={PROJECT_VALUE}"),
            format!("{SERVER}=abc"),
            format!("{SANDBOX}={sandbox}"),
        ];
        wanted.sort();
        assert_eq!(labels, wanted);
        assert_eq!(filter.len(), 1, "labels only");
    }
}
