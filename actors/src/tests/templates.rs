//! Templates on the fake runtime: a sandbox of one is made from its image
//! with its files and limits, keeps it through a fork, a revival and a
//! restart, and the pool keeps sandboxes of it ready; one that cannot be
//! built is reported and the others are offered.

use std::fs;
use std::time::Duration;

use uuid::Uuid;

use super::{pass, until, Server, OWNER};
use crate::config::{EgressPolicy, PoolConfig, PoolMin, TemplateConfig};
use crate::templates::TemplateError;
use crate::{CreateOptions, Quota, SandboxError, Settings};

/// A server offering `data` (with a file and its own memory), `offline`
/// (no network), and `broken` (whose build fails).
async fn server(tweak: impl FnOnce(&mut Settings)) -> (Server, tempfile::TempDir) {
    let files = tempfile::tempdir().unwrap();
    fs::create_dir(files.path().join("data")).unwrap();
    fs::write(files.path().join("data/points.csv"), "x,y\n1,2\n").unwrap();
    let files_dir = files.path().to_path_buf();
    let s = Server::with(move |settings| {
        settings.templates = vec![
            TemplateConfig {
                name: "data".into(),
                packages: vec!["pandas".into()],
                files: Some(files_dir),
                memory_mb: Some(1024),
                ..Default::default()
            },
            TemplateConfig {
                name: "offline".into(),
                network: Some(EgressPolicy::None),
                ..Default::default()
            },
            TemplateConfig {
                name: "broken".into(),
                packages: vec!["no-such-package-anywhere".into()],
                ..Default::default()
            },
        ];
        tweak(settings);
    })
    .await;
    (s, files)
}

async fn create(s: &Server, template: &str) -> crate::Result<Uuid> {
    let options = CreateOptions {
        template: Some(template.into()),
        ..Default::default()
    };
    Ok(s.sb().create(OWNER, None, Quota::UNLIMITED, options).await?.sandbox_id)
}

#[tokio::test(start_paused = true)]
async fn a_sandbox_of_a_template_is_made_from_its_image_with_its_files() {
    let (s, _files) = server(|_| {}).await;
    let id = create(&s, "data").await.unwrap();
    let image = s.fake.image_of(&s.container(id)).expect("a template's image");
    assert!(image.starts_with("mcp-sandbox-python-template-data-fake:"), "{image}");
    let results = s.settings.results_dir.join(id.to_string());
    assert_eq!(
        fs::read_to_string(results.join("data/points.csv")).unwrap(),
        "x,y\n1,2\n"
    );
    let info = s.sb().info(OWNER, id).await.unwrap();
    assert_eq!(info.template.as_deref(), Some("data"));
    // The default is the sandbox image, without files.
    let plain = s.create().await;
    assert_eq!(s.fake.image_of(&s.container(plain)), None);
    assert_eq!(s.sb().info(OWNER, plain).await.unwrap().template, None);
    // A template without network makes a sandbox without network.
    let offline = create(&s, "offline").await.unwrap();
    assert_eq!(
        s.sb().info(OWNER, offline).await.unwrap().egress,
        Some(EgressPolicy::None)
    );
}

#[tokio::test(start_paused = true)]
async fn an_unknown_or_unbuilt_template_is_refused_and_the_others_are_offered() {
    let (s, _files) = server(|_| {}).await;
    let err = create(&s, "nope").await.unwrap_err();
    assert!(
        matches!(err, SandboxError::Template(TemplateError::Unknown(_))),
        "{err}"
    );
    let err = create(&s, "broken").await.unwrap_err();
    assert!(
        matches!(&err, SandboxError::Template(TemplateError::NotBuilt { .. }))
            && !err.to_string().contains("no-such-package-anywhere"),
        "a tenant is not shown the build's output: {err}"
    );
    let listed = s.sb().templates();
    let detail = listed[0].detail.as_deref().unwrap_or_default();
    assert!(detail.contains("no-such-package-anywhere"), "the operator is: {detail}");
    assert!(!listed[0].error.as_deref().unwrap().contains("no-such-package-anywhere"));
    let names: Vec<(&str, bool)> = listed.iter().map(|t| (t.name.as_str(), t.available)).collect();
    assert_eq!(names, [("broken", false), ("data", true), ("offline", true)]);
    assert_eq!(listed[1].files, 1);
    assert!(s.fake.containers().is_empty(), "nothing made for a refused template");
}

#[tokio::test(start_paused = true)]
async fn a_template_whose_runtime_the_engine_lacks_is_not_offered_and_says_why() {
    let (s, _files) = server(|settings| {
        for (name, runtime) in [("gvisor", "runsc"), ("lean", "crun")] {
            settings.templates.push(TemplateConfig {
                name: name.into(),
                runtime: Some(runtime.into()),
                network: Some(EgressPolicy::None),
                ..Default::default()
            });
        }
    })
    .await;
    let listed = s.sb().templates();
    let gvisor = listed.iter().find(|t| t.name == "gvisor").unwrap();
    assert!(!gvisor.available);
    let detail = gvisor.detail.as_deref().unwrap_or_default();
    assert!(
        detail.contains("\"runsc\" is not registered") && detail.contains("runc, crun"),
        "{detail}"
    );
    let err = create(&s, "gvisor").await.unwrap_err();
    assert!(
        matches!(err, SandboxError::Template(TemplateError::NotBuilt { .. })),
        "{err}"
    );
    assert!(s.fake.containers().is_empty(), "nothing made for it");
    // A registered one is offered.
    let id = create(&s, "lean").await.unwrap();
    assert_eq!(s.sb().info(OWNER, id).await.unwrap().template.as_deref(), Some("lean"));
}

#[tokio::test(start_paused = true)]
async fn forks_revivals_and_restarts_keep_the_template() {
    let (mut s, _files) = server(|_| {}).await;
    let id = create(&s, "data").await.unwrap();
    let image = s.fake.image_of(&s.container(id)).unwrap();
    let forked = s
        .sb()
        .fork(OWNER, id, 1, None, Quota::UNLIMITED, Default::default())
        .await
        .unwrap();
    let fork = forked.forks[0].info.sandbox_id;
    assert_eq!(forked.forks[0].info.template.as_deref(), Some("data"));
    assert_eq!(s.fake.image_of(&s.container(fork)).as_ref(), Some(&image));
    // A container that vanished is made again from the template's image.
    let gone = s.container(id);
    s.fake.vanish(&gone);
    s.run(id, "print 1").await.ok();
    until("revived", || s.fake.container_of(id).is_some_and(|c| c != gone)).await;
    assert_eq!(s.fake.image_of(&s.container(id)).as_ref(), Some(&image));
    // A restarted server makes it from the recorded image even when the
    // template is gone from its configuration.
    s.settings.templates.clear();
    s.restart().await;
    let again = s.container(id);
    s.fake.vanish(&again);
    s.run(id, "print 1").await.ok();
    until("revived after the restart", || {
        s.fake.container_of(id).is_some_and(|c| c != again)
    })
    .await;
    assert_eq!(s.fake.image_of(&s.container(id)).as_ref(), Some(&image));
    assert_eq!(s.sb().info(OWNER, id).await.unwrap().template.as_deref(), Some("data"));
}

#[tokio::test(start_paused = true)]
async fn images_no_template_or_sandbox_uses_are_removed_at_a_start() {
    let (mut s, _files) = server(|_| {}).await;
    let id = create(&s, "data").await.unwrap();
    let used = s.fake.image_of(&s.container(id)).unwrap();
    let offline = s
        .fake
        .template_images()
        .into_iter()
        .find(|i| i.contains("-offline-fake:"))
        .unwrap();
    // The data template changes (a new image) and offline goes.
    s.settings.templates.retain(|t| t.name == "data");
    s.settings.templates[0].packages.push("matplotlib".into());
    s.restart().await;
    let images = s.fake.template_images();
    assert!(images.contains(&used), "a sandbox still runs the old image: {images:?}");
    assert!(!images.contains(&offline), "{images:?}");
    assert_eq!(images.len(), 2, "the old data image and the new one: {images:?}");
    // Made again (its container vanished), it runs the template as it is
    // built now: the current agent, the current definition.
    let gone = s.container(id);
    s.fake.vanish(&gone);
    s.run(id, "print 1").await.ok();
    until("revived", || s.fake.container_of(id).is_some_and(|c| c != gone)).await;
    let now = s.fake.image_of(&s.container(id)).unwrap();
    assert!(now != used && images.contains(&now), "{now}");
    s.sb().delete(OWNER, id).await.unwrap();
    s.restart().await;
    assert_eq!(s.fake.template_images(), [now], "only the new data image");
}

#[tokio::test(start_paused = true)]
async fn the_pools_together_fill_no_more_than_the_room_under_the_cap() {
    let (s, _files) = server(|settings| {
        settings.pool = PoolConfig {
            min: PoolMin::Fixed(2),
            max: 8,
            ..PoolConfig::default()
        };
        settings.templates[0].pool_min = 2;
        settings.templates[1].pool_min = 2;
        settings.max_sandboxes_total = 3;
    })
    .await;
    until("the pools filled", || s.sb().pool_ready() >= 3).await;
    pass(Duration::from_secs(60)).await;
    assert_eq!(
        s.sb().pool_ready(),
        3,
        "three places under the cap, whatever each pool's min"
    );
}

#[tokio::test(start_paused = true)]
async fn a_sandbox_of_a_template_without_network_forks_into_ones_without_network() {
    let (s, _files) = server(|_| {}).await;
    let id = create(&s, "offline").await.unwrap();
    let forked = s
        .sb()
        .fork(OWNER, id, 1, None, Quota::UNLIMITED, Default::default())
        .await
        .unwrap();
    let fork = &forked.forks[0].info;
    assert_eq!(
        (fork.template.as_deref(), fork.egress),
        (Some("offline"), Some(EgressPolicy::None))
    );
}

#[tokio::test(start_paused = true)]
async fn the_pool_keeps_sandboxes_of_a_template_and_serves_its_burst() {
    let (s, _files) = server(|settings| {
        settings.pool = PoolConfig {
            min: PoolMin::Fixed(0),
            max: 4,
            ..PoolConfig::default()
        };
        settings.templates[0].pool_min = 3;
    })
    .await;
    until("the template's pool filled", || s.sb().pool_ready() == 3).await;
    let before = s.sb().stats().await.pool;
    let burst = (0..3).map(|_| create(&s, "data"));
    let ids: Vec<Uuid> = futures_util::future::join_all(burst)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let after = s.sb().stats().await.pool;
    assert_eq!(after.claims - before.claims, 3, "{after:?}");
    assert_eq!(after.misses, before.misses, "served from the pool: {after:?}");
    for id in ids {
        assert!(s
            .fake
            .image_of(&s.container(id))
            .unwrap()
            .contains("-template-data-fake:"));
        let results = s.settings.results_dir.join(id.to_string());
        assert!(results.join("data/points.csv").is_file(), "its files were placed");
    }
    // The default image's pool stays empty (min 0, no claims), and the
    // template's refills stay within pool.max over all pools.
    pass(Duration::from_secs(30)).await;
    assert!(s.sb().pool_ready() <= 4);
    let plain = s.create().await;
    assert_eq!(
        s.fake.image_of(&s.container(plain)),
        None,
        "not from the template's pool"
    );
}

#[tokio::test(start_paused = true)]
async fn a_template_s_disk_sizes_apply_to_its_sandboxes_only() {
    let (s, _files) = server(|settings| {
        settings.sandbox.results_mb = 64;
        settings.sandbox.results_inodes = 4096;
        settings.templates[0].results_mb = Some(32);
    })
    .await;
    let image = |id: Uuid| {
        let path = s
            .settings
            .state_dir
            .join("disks")
            .join(id.to_string())
            .join("results.img");
        fs::metadata(path).unwrap().len() >> 20
    };
    let data = create(&s, "data").await.unwrap();
    let plain = s.create().await;
    assert_eq!((image(data), image(plain)), (32, 64));
    // Its files went onto its own disk.
    let results = s.settings.results_dir.join(data.to_string());
    assert!(results.join("data/points.csv").is_file());
}

#[tokio::test(start_paused = true)]
async fn memory_is_counted_at_each_template_s_limit_for_awake_sandboxes_only() {
    let (s, _files) = server(|settings| settings.sandbox.memory_mb = 512).await;
    let mb = |s: &Server| s.sb().resources().memory_limits_bytes >> 20;
    assert_eq!(s.sb().pool_ready(), 0, "the pool is off here");
    let plain = s.create().await;
    let data = create(&s, "data").await.unwrap();
    assert_eq!(mb(&s), 512 + 1024, "the default's limit, and the template's own");
    s.sb().hibernate(OWNER, plain).await.unwrap();
    assert_eq!(mb(&s), 1024, "a sandbox asleep on disk holds no memory");
    s.sb().hibernate(OWNER, data).await.unwrap();
    assert_eq!(mb(&s), 0);
    s.run(data, "echo awake").await.unwrap();
    assert_eq!(mb(&s), 1024, "woken, it counts again");
}
