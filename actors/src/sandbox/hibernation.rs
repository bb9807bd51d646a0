//! Hibernation: a sandbox idle for `sandbox.hibernate_after_seconds`, or
//! asked to, sleeps on disk; its next call wakes it.
//!
//! Asleep, it holds no memory and no kernel object: its Python namespace is
//! written to a fork file on its own results disk (as a fork carries it),
//! its record marks it asleep (durably, before anything goes), its
//! container is removed (the package volume stays), its disks are
//! unmounted and its egress proxy detached. Waking mounts the disks,
//! attaches the proxy, makes a container on them and loads the namespace
//! into the new worker. Background processes end with the container; the
//! Python copies snapshots parked in memory are written out to their store
//! first ([`super::snapshot::write_out`]).

use std::time::Instant;

use tracing::{info, warn};
use uuid::Uuid;

use crate::agent_connection::AgentConnection;
use crate::config::EgressPolicy;
use crate::error::{Result, SandboxError};
use crate::moment;
use crate::records::Hibernated;
use crate::templates::disk_sizes;
use crate::usage::reading::Subject;
use sandbox_runtime::agent::{Carried, CarriedState};

/// Who asked for the sleep: the actor's upkeep puts a sandbox to sleep only
/// when nothing of its namespace would be lost; a caller may accept that
/// what does not pickle (an open socket) is left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Asked {
    Upkeep,
    Caller,
}

/// Puts the sandbox to sleep; answers with what it kept. Fails with
/// nothing changed when its namespace could not be written (or, asked by
/// upkeep, not whole) or its container not removed; the record is marked
/// asleep before the container goes, and unmarked again if it cannot go.
pub(super) async fn sleep(
    link: &mut AgentConnection,
    asked: Asked,
    usage: Subject,
) -> Result<(Hibernated, Vec<(Uuid, Carried)>)> {
    let ctx = link.ctx().clone();
    let id = link.paths.id;
    // First the snapshots' copies: the sandbox's own namespace file must be
    // the last the agent writes (each dump clears the fork files before it).
    let kept = super::snapshot::write_out(link, asked == Asked::Upkeep).await?;
    let snapshots = ctx.snapshots.totals(id);
    let slot = Uuid::new_v4().simple().to_string();
    let (python, _) = link.dump_python(&slot, None).await?;
    let whole = matches!(python.python, CarriedState::Carried | CarriedState::Fresh);
    if python.python == CarriedState::Lost || (asked == Asked::Upkeep && !whole) {
        return Err(SandboxError::Asleep {
            id,
            why: format!(
                "not put to sleep: its Python variables could not be saved ({}); nothing was changed",
                reasons(&python.skipped)
            ),
        });
    }
    let hibernated = Hibernated {
        since: moment::now(),
        slot,
        python,
        snapshots,
    };
    let marked = hibernated.clone();
    ctx.store
        .update(vec![id], move |r| r.hibernated = Some(marked.clone()))
        .await?;
    // What it used since its last sample, read while its container is there.
    ctx.read_usage(usage, false).await;
    if let Err(e) = link.remove_container().await {
        ctx.store.update(vec![id], |r| r.hibernated = None).await?;
        return Err(e);
    }
    ctx.egress.detach(id);
    if let Err(e) = ctx.disks.release(id).await {
        warn!(sandbox = %id, error = %e, "could not unmount a sleeping sandbox's disks; they stay mounted");
    }
    Ok((hibernated, kept))
}

/// Wakes the sleeping sandbox: its old container gone for sure, its disks,
/// its proxy, a new container, its namespace; answers with the notice that
/// says what came back. A wake that fails undoes what it set up and leaves
/// the saved state where it was.
pub(super) async fn wake(link: &mut AgentConnection, asleep: &Hibernated, egress: EgressPolicy) -> Result<String> {
    let ctx = link.ctx().clone();
    let id = link.paths.id;
    let started = Instant::now();
    // One a crash left (or the engine would not remove) must never run on
    // the disks mounted again.
    link.remove_container().await?;
    let removed = started.elapsed();
    let mut mounted = removed;
    let set_up = async {
        ctx.disks
            .ensure(id, disk_sizes(ctx.templates.of(id).as_deref()))
            .await?;
        if ctx.egress.attached_policy(id).is_none() {
            ctx.egress.attach(id, egress)?;
        }
        mounted = started.elapsed();
        link.recreate().await?;
        link.check_retired()
    }
    .await;
    if let Err(e) = set_up {
        let _ = link.remove_container().await;
        ctx.egress.detach(id);
        let _ = ctx.disks.release(id).await;
        return Err(e);
    }
    let running = started.elapsed();
    let loaded = match asleep.python.python {
        CarriedState::Carried | CarriedState::Partial => Some(
            link.load_python(&asleep.slot)
                .await
                .map(|(carried, _)| carried)
                .map_err(|e| e.to_string()),
        ),
        CarriedState::Fresh | CarriedState::Lost => None,
    };
    let python = started.elapsed();
    let container = link.container_id.clone();
    ctx.store
        .update(vec![id], move |r| {
            r.hibernated = None;
            r.container_id = container.clone();
        })
        .await?;
    // Where a wake's time goes, for whoever tunes it: the old container's
    // removal, the disks and proxy, the new container up to its agent's
    // answer, the namespace's load, the record.
    let ms = |d: std::time::Duration| d.as_millis() as u64;
    info!(
        sandbox = %id,
        removed_ms = ms(removed),
        disks_ms = ms(mounted - removed),
        container_ms = ms(running - mounted),
        python_ms = ms(python - running),
        record_ms = ms(started.elapsed() - python),
        "woke from hibernation"
    );
    Ok(woke(asleep, loaded))
}

/// What a woken sandbox tells its next caller.
fn woke(asleep: &Hibernated, loaded: Option<std::result::Result<Carried, String>>) -> String {
    let saved = &asleep.python;
    let python = match (saved.python, loaded) {
        (CarriedState::Fresh, _) => "Python: fresh (no Python had run before it slept)".to_string(),
        (_, Some(Err(why))) => format!("Python: fresh (its saved variables could not be loaded: {why})"),
        (_, Some(Ok(c))) if c.python == CarriedState::Lost => format!(
            "Python: fresh (its saved variables could not be loaded: {})",
            reasons(&c.skipped)
        ),
        (CarriedState::Partial, Some(Ok(c))) => format!(
            "Python: partial ({} names back; not saved: {})",
            c.names,
            reasons(&saved.skipped)
        ),
        (_, Some(Ok(c))) => format!(
            "Python: carried (its variables and imports are back, {} names)",
            c.names
        ),
        (_, None) => format!(
            "Python: fresh (its variables could not be saved: {})",
            reasons(&saved.skipped)
        ),
    };
    format!(
        "The sandbox woke from hibernation (asleep since {}). {python}. Files in /app/results and installed \
         packages are back; background processes ended when it went to sleep.",
        crate::moment::format(asleep.since)
    )
}

/// `name (why), …` of the names a dump or load left out.
pub(super) fn reasons(skipped: &[(String, String)]) -> String {
    match skipped.is_empty() {
        true => "no reason given".into(),
        false => skipped
            .iter()
            .map(|(name, why)| format!("{name} ({why})"))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshots::SnapshotTotals;

    fn asleep(python: CarriedState, names: u64, skipped: &[(&str, &str)]) -> Hibernated {
        Hibernated {
            since: time::OffsetDateTime::UNIX_EPOCH,
            slot: "s".into(),
            python: Carried {
                python,
                names,
                skipped: skipped.iter().map(|(n, w)| (n.to_string(), w.to_string())).collect(),
            },
            snapshots: SnapshotTotals::default(),
        }
    }

    fn carried(python: CarriedState, names: u64) -> Option<std::result::Result<Carried, String>> {
        Some(Ok(Carried {
            python,
            names,
            skipped: vec![],
        }))
    }

    #[test]
    fn a_woken_sandbox_says_what_of_its_python_came_back() {
        let all = woke(
            &asleep(CarriedState::Carried, 3, &[]),
            carried(CarriedState::Carried, 3),
        );
        assert!(all.contains("Python: carried") && all.contains("3 names"), "{all}");
        let some = woke(
            &asleep(CarriedState::Partial, 2, &[("sock", "TypeError: cannot pickle")]),
            carried(CarriedState::Carried, 2),
        );
        assert!(
            some.contains("Python: partial") && some.contains("sock (TypeError"),
            "{some}"
        );
        let none = woke(&asleep(CarriedState::Fresh, 0, &[]), None);
        assert!(none.contains("Python: fresh (no Python had run"), "{none}");
        let failed = woke(&asleep(CarriedState::Carried, 3, &[]), Some(Err("agent gone".into())));
        assert!(
            failed.contains("Python: fresh") && failed.contains("agent gone"),
            "{failed}"
        );
        let unsaved = woke(&asleep(CarriedState::Lost, 0, &[("*", "MemoryError")]), None);
        assert!(unsaved.contains("could not be saved: * (MemoryError)"), "{unsaved}");
    }
}
