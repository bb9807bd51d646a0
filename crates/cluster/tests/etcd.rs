//! Membership and the directory against real etcd members.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::EtcdCluster;
use sandbox_cluster::{Capacity, Cluster, ClusterError, Entry};
use uuid::Uuid;

fn capacity(ready: usize) -> Arc<dyn Fn() -> Capacity + Send + Sync> {
    Arc::new(move || Capacity {
        ready,
        live: 1,
        free_memory_mb: 1024,
        runtimes: vec!["runc".into()],
    })
}

fn prefix() -> String {
    format!("/test-{}/", Uuid::new_v4().simple())
}

async fn until(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "{what} within {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_node_is_up_while_its_lease_lives_and_down_once_it_leaves() {
    let etcd = EtcdCluster::start(1);
    let prefix = prefix();
    let a = Cluster::join(etcd.config("a", &prefix), capacity(3)).unwrap();
    let b = Cluster::join(etcd.config("b", &prefix), capacity(0)).unwrap();
    let admin = Cluster::admin(&etcd.config("admin", &prefix)).unwrap();
    until("both nodes up", Duration::from_secs(10), async || {
        admin.status().await.unwrap().iter().filter(|n| n.state == "up").count() == 2
    })
    .await;
    assert!(a.membership.holds() && a.check_held().is_ok());
    let status = admin.status().await.unwrap();
    let figures = status[0].figures.as_ref().unwrap();
    assert_eq!((figures.name.as_str(), figures.capacity.ready), ("a", 3));
    assert_eq!(figures.url, "http://a.test:8080");

    admin.drain("b", true).await.unwrap();
    let draining = a.draining_nodes().await.unwrap();
    assert!(draining.contains("b") && !draining.contains("a"), "{draining:?}");

    b.leave().await;
    let status = admin.status().await.unwrap();
    let b_status = status.iter().find(|n| n.name == "b").unwrap();
    assert_eq!(b_status.state, "down", "a node that leaves is down at once: {status:?}");
    assert!(b_status.draining);
    a.leave().await;
}

#[tokio::test]
async fn the_directory_takes_each_id_once_and_counts_by_tenant() {
    let etcd = EtcdCluster::start(1);
    let prefix = prefix();
    let a = Cluster::join(etcd.config("a", &prefix), capacity(0)).unwrap();
    let dir = &a.directory;
    let (x, y) = (Uuid::new_v4(), Uuid::new_v4());
    let on_a = |tenant: &str| Entry {
        node: "a".into(),
        tenant: tenant.into(),
    };
    dir.claim(x, &on_a("alice")).await.unwrap();
    dir.claim(x, &on_a("alice"))
        .await
        .expect("a retried claim finds its own entry");
    let stolen = Entry {
        node: "b".into(),
        tenant: "mallory".into(),
    };
    assert!(matches!(dir.claim(x, &stolen).await, Err(ClusterError::Taken(id)) if id == x));
    dir.claim(y, &on_a("bob")).await.unwrap();
    assert_eq!(dir.lookup(x).await.unwrap(), Some(on_a("alice")));
    assert_eq!(dir.count_of_tenant("alice").await.unwrap(), 1);
    assert_eq!(dir.count().await.unwrap(), 2);
    let mut held = dir.held_by("a").await.unwrap();
    held.sort();
    let mut both = vec![x, y];
    both.sort();
    assert_eq!(held, both);

    // A hibernated sandbox keeps its entry; the counts of live ones leave
    // it out until it wakes; no mark outlives its entry.
    assert!(dir.mark_asleep(x, &on_a("alice"), true).await.unwrap());
    assert_eq!(dir.asleep_on("a").await.unwrap(), vec![x]);
    assert_eq!(dir.count_of_tenant("alice").await.unwrap(), 0);
    assert_eq!(dir.count().await.unwrap(), 1);
    assert_eq!(dir.lookup(x).await.unwrap(), Some(on_a("alice")));
    assert!(
        !dir.mark_asleep(x, &stolen, true).await.unwrap(),
        "only its own entry is marked"
    );
    assert!(dir.mark_asleep(x, &on_a("alice"), false).await.unwrap());
    assert_eq!(dir.count_of_tenant("alice").await.unwrap(), 1);
    assert_eq!(dir.count().await.unwrap(), 2);
    assert!(dir.mark_asleep(x, &on_a("alice"), true).await.unwrap());

    assert!(!dir.release(x, "b").await.unwrap(), "only the holder removes an entry");
    assert!(dir.release(x, "a").await.unwrap());
    assert_eq!(dir.lookup(x).await.unwrap(), None);
    assert_eq!(dir.count_of_tenant("alice").await.unwrap(), 0);
    assert!(dir.asleep_on("a").await.unwrap().is_empty(), "its mark went with it");
    assert!(!dir.mark_asleep(x, &on_a("alice"), true).await.unwrap());
    assert_eq!(dir.count().await.unwrap(), 1);
    assert_eq!(dir.held_by("a").await.unwrap(), vec![y]);
    a.leave().await;

    // A node that will not return is forgotten with its sandboxes; one
    // that is up is not.
    let admin = Cluster::admin(&etcd.config("admin", &prefix)).unwrap();
    let c = Cluster::join(etcd.config("c", &prefix), capacity(0)).unwrap();
    until("c up", Duration::from_secs(10), async || c.membership.holds()).await;
    assert!(admin.forget("c").await.is_err(), "an up node is not forgotten");
    assert_eq!(admin.forget("a").await.unwrap(), 1);
    assert_eq!(dir.count().await.unwrap(), 0);
    let listed: Vec<String> = admin.status().await.unwrap().into_iter().map(|n| n.name).collect();
    assert_eq!(listed, ["c"], "a forgotten node is no longer listed");
    c.leave().await;
}

/// With etcd unanswering (frozen, as a partition leaves it), the node stops
/// counting itself the holder of its sandboxes within its lease, and the
/// directory refuses changes with an error that says so; both come back.
#[tokio::test]
async fn a_node_cut_off_from_etcd_stops_holding_within_its_lease() {
    let etcd = EtcdCluster::start(1);
    let a = Cluster::join(etcd.config("a", &prefix()), capacity(0)).unwrap();
    until("a up", Duration::from_secs(10), async || a.membership.holds()).await;
    etcd.freeze(true);
    let cut = Instant::now();
    until("a detached", Duration::from_secs(5), async || !a.membership.holds()).await;
    assert!(
        cut.elapsed() <= Duration::from_secs(3),
        "within the 3 s lease: {:?}",
        cut.elapsed()
    );
    let err = a.check_held().unwrap_err();
    assert!(err.to_string().contains("could not renew its membership"), "{err}");
    let refused = a
        .directory
        .claim(
            Uuid::new_v4(),
            &Entry {
                node: "a".into(),
                tenant: "t".into(),
            },
        )
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("etcd) is unavailable"), "{refused}");
    etcd.freeze(false);
    until("a back", Duration::from_secs(10), async || a.membership.holds()).await;
    a.leave().await;
}

/// One member of three lost changes nothing; two lost (no quorum) refuse
/// changes, and say so.
#[tokio::test]
async fn one_member_lost_changes_nothing_and_quorum_lost_refuses_changes() {
    let mut etcd = EtcdCluster::start(3);
    let a = Cluster::join(etcd.config("a", &prefix()), capacity(0)).unwrap();
    until("a up", Duration::from_secs(10), async || a.membership.holds()).await;
    let entry = Entry {
        node: "a".into(),
        tenant: "t".into(),
    };
    etcd.kill(0);
    for _ in 0..5 {
        a.directory
            .claim(Uuid::new_v4(), &entry)
            .await
            .expect("two members of three keep quorum");
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(a.membership.holds(), "the lease is renewed through the other members");
    etcd.kill(1);
    let started = Instant::now();
    let err = a.directory.claim(Uuid::new_v4(), &entry).await.unwrap_err();
    assert!(matches!(err, ClusterError::Etcd(_)), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    a.leave().await;
}

/// Two processes configured with one node name: the second never holds
/// while the first lives, and takes the name once the first leaves.
#[tokio::test]
async fn a_node_name_is_held_by_one_process_at_a_time() {
    let etcd = EtcdCluster::start(1);
    let prefix = prefix();
    let first = Cluster::join(etcd.config("a", &prefix), capacity(1)).unwrap();
    until("the first up", Duration::from_secs(10), async || {
        first.membership.holds()
    })
    .await;
    let second = Cluster::join(etcd.config("a", &prefix), capacity(2)).unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!second.membership.holds(), "the name is the first's");
    assert!(second.check_held().is_err());
    first.leave().await;
    until("the second takes the name", Duration::from_secs(10), async || {
        second.membership.holds()
    })
    .await;
    let admin = Cluster::admin(&etcd.config("admin", &prefix)).unwrap();
    let status = admin.status().await.unwrap();
    assert_eq!(
        status[0].figures.as_ref().unwrap().capacity.ready,
        2,
        "the second's figures"
    );
    second.leave().await;
}

/// etcd over TLS with client certificates: a node with the CA and its
/// certificate joins and claims; one without its certificate, or without
/// the CA that signed the members', is refused and says it is etcd.
#[tokio::test]
async fn etcd_over_tls_takes_a_node_with_its_certificate_and_refuses_one_without() {
    let etcd = EtcdCluster::start_tls(1);
    let prefix = prefix();
    let a = Cluster::join(etcd.config("a", &prefix), capacity(0)).unwrap();
    until("a up over TLS", Duration::from_secs(10), async || a.membership.holds()).await;
    let entry = Entry {
        node: "a".into(),
        tenant: "t".into(),
    };
    a.directory.claim(Uuid::new_v4(), &entry).await.unwrap();
    assert_eq!(a.directory.count().await.unwrap(), 1);
    let mut no_cert = etcd.config("admin", &prefix);
    (no_cert.etcd_cert_file, no_cert.etcd_key_file) = (None, None);
    let mut no_ca = etcd.config("admin", &prefix);
    no_ca.etcd_ca_file = None;
    for config in [no_cert, no_ca] {
        let admin = Cluster::admin(&config).unwrap();
        let err = admin.status().await.unwrap_err();
        assert!(matches!(err, ClusterError::Etcd(_)), "{err}");
    }
    a.leave().await;
}
