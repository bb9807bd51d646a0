//! Where a new sandbox goes: to a node with a ready pooled sandbox (it is
//! interactive at once), otherwise to the node with the most free memory,
//! then the fewest live sandboxes; ties stay on the node that was asked,
//! and draining nodes take none.
//! The nodes' figures are a renewal old: the creations this node placed
//! since ([`Recent`]) are counted against them, so that a burst is spread
//! instead of sent whole to the node whose figures looked best.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::membership::NodeFigures;

/// The most placements remembered (a burst larger than this within the
/// window is counted as this many).
const MOST_REMEMBERED: usize = 10_000;

/// The creations this node placed lately, which the nodes' published
/// figures may not show yet.
pub struct Recent {
    window: Duration,
    placed: Mutex<VecDeque<(Instant, String)>>,
}

impl Recent {
    /// Placements are remembered for `window`: longer than it takes a
    /// node's figures to show them.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            placed: Mutex::default(),
        }
    }

    /// The node a creation asked of `here` goes to ([`choose`]), on the
    /// figures of `up` less the recent placements, and noted as one: under
    /// one lock, so that creations placed at once each see the others.
    pub fn place(
        &self,
        here: &str,
        mut up: Vec<NodeFigures>,
        draining: &HashSet<String>,
        memory_mb: u64,
    ) -> Option<NodeFigures> {
        let mut placed = self.placed.lock().expect("never poisoned");
        self.discount(&mut placed, &mut up, memory_mb);
        let chosen = choose(here, &up, draining)?.clone();
        if placed.len() == MOST_REMEMBERED {
            placed.pop_front();
        }
        placed.push_back((Instant::now(), chosen.name.clone()));
        Some(chosen)
    }

    /// The nodes' figures less the recent placements (`placed`): each took
    /// a ready pooled sandbox while the figures still show one, otherwise
    /// `memory_mb` of free memory; each is one more live sandbox.
    fn discount(&self, placed: &mut VecDeque<(Instant, String)>, up: &mut [NodeFigures], memory_mb: u64) {
        let now = Instant::now();
        while placed
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > self.window)
        {
            placed.pop_front();
        }
        for (_, name) in placed.iter() {
            if let Some(node) = up.iter_mut().find(|n| &n.name == name) {
                let c = &mut node.capacity;
                c.live += 1;
                match c.ready {
                    0 => c.free_memory_mb = c.free_memory_mb.saturating_sub(memory_mb),
                    _ => c.ready -= 1,
                }
            }
        }
    }
}

/// The node a creation asked of `here` goes to, among the nodes that are
/// `up`; `None` when every node that is up drains.
pub fn choose<'a>(here: &str, up: &'a [NodeFigures], draining: &HashSet<String>) -> Option<&'a NodeFigures> {
    let open: Vec<&NodeFigures> = up.iter().filter(|n| !draining.contains(&n.name)).collect();
    let asked = open.iter().copied().find(|n| n.name == here);
    if let Some(asked) = asked.filter(|n| n.capacity.ready > 0) {
        return Some(asked);
    }
    let best = |key: fn(&NodeFigures) -> (u64, u64)| {
        let most = open.iter().map(|n| key(n)).max()?;
        let tied: Vec<&NodeFigures> = open.iter().copied().filter(|n| key(n) == most).collect();
        tied.iter()
            .copied()
            .find(|n| n.name == here)
            .or_else(|| tied.into_iter().min_by(|a, b| a.name.cmp(&b.name)))
    };
    match open.iter().any(|n| n.capacity.ready > 0) {
        true => best(|n| (n.capacity.ready as u64, 0)),
        // Hosts whose sandboxes' limits add up past their memory all show
        // none free: the fewest live sandboxes decide.
        false => best(|n| (n.capacity.free_memory_mb, u64::MAX - n.capacity.live as u64)),
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
    fn a_burst_is_spread_by_the_placements_the_figures_do_not_show_yet() {
        let recent = Recent::new(Duration::from_secs(60));
        let figures = [node("a", 2, 4000), node("b", 1, 4000), node("c", 0, 3000)];
        let mut placed = vec![];
        for _ in 0..6 {
            let node = recent.place("a", figures.to_vec(), &HashSet::new(), 1000).unwrap();
            placed.push(node.name);
        }
        // a's two pooled, b's one, then memory: b (4000, fewer live than a),
        // a (4000), then all at 3000 and c has the fewest live.
        assert_eq!(placed, ["a", "a", "b", "b", "a", "c"]);
    }

    #[test]
    fn on_hosts_without_free_memory_the_fewest_live_sandboxes_win() {
        let recent = Recent::new(Duration::from_secs(60));
        let mut figures = [node("a", 0, 0), node("b", 0, 0), node("c", 0, 0)];
        figures[0].capacity.live = 2;
        let mut placed = vec![];
        for _ in 0..5 {
            let node = recent.place("a", figures.to_vec(), &HashSet::new(), 512).unwrap();
            placed.push(node.name);
        }
        assert_eq!(placed, ["b", "c", "b", "c", "a"]);
    }

    #[test]
    fn placements_older_than_the_window_are_forgotten() {
        let recent = Recent::new(Duration::from_millis(50));
        let up = vec![node("a", 1, 100), node("b", 1, 100)];
        let none = HashSet::new();
        assert_eq!(recent.place("a", up.clone(), &none, 10).unwrap().name, "a");
        assert_eq!(
            recent.place("a", up.clone(), &none, 10).unwrap().name,
            "b",
            "a's one pooled sandbox is taken"
        );
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(
            recent.place("a", up, &none, 10).unwrap().name,
            "a",
            "forgotten once the figures show it"
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
