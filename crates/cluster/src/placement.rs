//! Where a new sandbox goes: to a node with a ready pooled sandbox (it is
//! interactive at once), otherwise to the node with the most free memory;
//! ties stay on the node that was asked, and draining nodes take none.

use std::collections::HashSet;

use crate::membership::NodeFigures;

/// The node a creation asked of `here` goes to, among the nodes that are
/// `up`; `None` when every node that is up drains.
pub fn choose<'a>(here: &str, up: &'a [NodeFigures], draining: &HashSet<String>) -> Option<&'a NodeFigures> {
    let open: Vec<&NodeFigures> = up.iter().filter(|n| !draining.contains(&n.name)).collect();
    let asked = open.iter().copied().find(|n| n.name == here);
    if let Some(asked) = asked.filter(|n| n.capacity.ready > 0) {
        return Some(asked);
    }
    let best = |key: fn(&NodeFigures) -> u64| {
        let most = open.iter().map(|n| key(n)).max()?;
        let tied: Vec<&NodeFigures> = open.iter().copied().filter(|n| key(n) == most).collect();
        tied.iter()
            .copied()
            .find(|n| n.name == here)
            .or_else(|| tied.into_iter().min_by(|a, b| a.name.cmp(&b.name)))
    };
    match open.iter().any(|n| n.capacity.ready > 0) {
        true => best(|n| n.capacity.ready as u64),
        false => best(|n| n.capacity.free_memory_mb),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::Capacity;

    fn node(name: &str, ready: usize, free_memory_mb: u64) -> NodeFigures {
        NodeFigures {
            name: name.into(),
            url: format!("http://{name}"),
            capacity: Capacity {
                ready,
                live: 0,
                free_memory_mb,
                runtimes: vec![],
            },
        }
    }

    fn chosen(here: &str, up: &[NodeFigures], draining: &[&str]) -> Option<String> {
        let draining = draining.iter().map(|s| s.to_string()).collect();
        choose(here, up, &draining).map(|n| n.name.clone())
    }

    #[test]
    fn a_ready_pooled_sandbox_wins_and_the_asked_node_keeps_ties() {
        let up = [node("a", 0, 9000), node("b", 2, 100), node("c", 2, 100)];
        assert_eq!(
            chosen("a", &up, &[]).as_deref(),
            Some("b"),
            "a pooled sandbox over memory"
        );
        assert_eq!(
            chosen("c", &up, &[]).as_deref(),
            Some("c"),
            "the asked node keeps a tie"
        );
        let up = [node("a", 1, 0), node("b", 5, 0)];
        assert_eq!(
            chosen("a", &up, &[]).as_deref(),
            Some("a"),
            "the asked node serves from its own pool"
        );
    }

    #[test]
    fn without_pooled_sandboxes_the_most_free_memory_wins() {
        let up = [node("a", 0, 100), node("b", 0, 900), node("c", 0, 500)];
        assert_eq!(chosen("a", &up, &[]).as_deref(), Some("b"));
        let up = [node("a", 0, 900), node("b", 0, 900)];
        assert_eq!(chosen("b", &up, &[]).as_deref(), Some("b"));
    }

    #[test]
    fn draining_nodes_take_nothing() {
        let up = [node("a", 3, 900), node("b", 0, 100)];
        assert_eq!(chosen("a", &up, &["a"]).as_deref(), Some("b"));
        assert_eq!(chosen("a", &up, &["a", "b"]), None);
        assert_eq!(chosen("a", &[], &[]), None, "no node up");
    }
}
