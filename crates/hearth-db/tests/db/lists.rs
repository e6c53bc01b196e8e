use std::collections::HashSet;
use std::time::Duration;

use hearth_db::{
    Db, DbError, Quotas, SandboxFilter, SandboxRow, SandboxSort, SandboxStatus, SortOrder,
    Timestamp,
};
use hearth_types::WorkspaceId;

use crate::{each_backend, sandbox, workspace};

/// Walks every page; returns the names in order and the page count.
async fn walk(db: &Db, ws: WorkspaceId, mut f: SandboxFilter) -> (Vec<String>, usize) {
    let mut names = Vec::new();
    let mut pages = 0;
    loop {
        let page = db.list_sandboxes(ws, &f).await.unwrap();
        pages += 1;
        assert!(page.items.len() <= f.page_size as usize);
        names.extend(page.items.into_iter().map(|s| s.name));
        match page.next_cursor {
            Some(c) => f.cursor = Some(c),
            None => return (names, pages),
        }
        assert!(pages < 1000, "pagination does not terminate");
    }
}

/// name, status, labels, created_by, stopped_at (ms), idle TTL (s).
type FixtureRow = (
    &'static str,
    SandboxStatus,
    &'static [(&'static str, &'static str)],
    &'static str,
    Option<i64>,
    u64,
);

/// Nine sandboxes with varied fields.
async fn fixture(db: &Db) -> (WorkspaceId, Vec<SandboxRow>) {
    let ws = workspace(db, Quotas::default()).await.id;
    // Rows of another workspace never show up.
    let other = workspace(db, Quotas::default()).await.id;
    db.insert_sandbox(&sandbox(other, "alpha")).await.unwrap();

    let spec: &[FixtureRow] = &[
        (
            "alpha",
            SandboxStatus::Ready,
            &[("team", "infra"), ("env", "prod")],
            "alice",
            None,
            600,
        ),
        (
            "Beta",
            SandboxStatus::Stopped,
            &[("team", "infra")],
            "bob",
            Some(5_000),
            600,
        ),
        (
            "gamma-1",
            SandboxStatus::Ready,
            &[("team", "web"), ("env", "prod")],
            "alice",
            None,
            0,
        ),
        (
            "gamma_2",
            SandboxStatus::Failed,
            &[],
            "alice",
            Some(3_000),
            60,
        ),
        (
            "delta%",
            SandboxStatus::Provisioning,
            &[("env", "dev")],
            "bob",
            None,
            600,
        ),
        (
            "epsilon",
            SandboxStatus::Stopped,
            &[("team", "web")],
            "alice",
            Some(5_000),
            120,
        ),
        (
            "zeta",
            SandboxStatus::Deleting,
            &[("x", "")],
            "carol",
            None,
            60,
        ),
        ("eta", SandboxStatus::Ready, &[], "bob", None, 600),
        (
            "theta",
            SandboxStatus::Stopped,
            &[("team", "infra")],
            "alice",
            Some(1_000),
            0,
        ),
    ];
    let base = Timestamp::from_unix_ms(1_800_000_000_000);
    let mut rows = Vec::new();
    for (i, (name, status, labels, by, stopped, ttl)) in spec.iter().enumerate() {
        let mut s = sandbox(ws, name);
        s.status = *status;
        s.labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        s.created_by = by.to_string();
        s.stopped_at = stopped.map(Timestamp::from_unix_ms);
        s.idle_ttl = Duration::from_secs(*ttl);
        s.delete_after_stop = Duration::from_secs(60 * (i as u64 % 3));
        // Pairs share a creation time, so ties fall back to the id.
        s.created_at = Timestamp::from_unix_ms(base.unix_ms() + (i as i64 / 2));
        db.insert_sandbox(&s).await.unwrap();
        rows.push(s);
    }
    (ws, rows)
}

fn expect(rows: &[SandboxRow], keep: impl Fn(&SandboxRow) -> bool) -> HashSet<String> {
    rows.iter()
        .filter(|s| keep(s))
        .map(|s| s.name.clone())
        .collect()
}

#[tokio::test]
async fn every_filter_narrows_the_list() {
    each_backend!(|db| {
        let (ws, rows) = fixture(db).await;
        let list = |f: SandboxFilter| async move {
            let (names, _) = walk(db, ws, f).await;
            names.into_iter().collect::<HashSet<_>>()
        };
        let all = list(SandboxFilter::default()).await;
        assert_eq!(all, expect(&rows, |_| true));

        let by_name = |n: &str| SandboxFilter {
            name_contains: Some(n.into()),
            ..SandboxFilter::default()
        };
        assert_eq!(
            list(by_name("GAMMA")).await,
            expect(&rows, |s| s.name.starts_with("gamma"))
        );
        assert_eq!(
            list(by_name("beta")).await,
            expect(&rows, |s| s.name == "Beta")
        );
        // LIKE wildcards in the needle are literal.
        assert_eq!(
            list(by_name("_")).await,
            expect(&rows, |s| s.name == "gamma_2")
        );
        assert_eq!(
            list(by_name("%")).await,
            expect(&rows, |s| s.name == "delta%")
        );
        assert_eq!(list(by_name("nothing")).await, HashSet::new());

        for status in SandboxStatus::ALL {
            let f = SandboxFilter {
                status: Some(*status),
                ..SandboxFilter::default()
            };
            assert_eq!(
                list(f).await,
                expect(&rows, |s| s.status == *status),
                "{status}"
            );
        }

        let by_labels = |l: &[(&str, Option<&str>)]| SandboxFilter {
            labels: l
                .iter()
                .map(|(k, v)| (k.to_string(), v.map(str::to_owned)))
                .collect(),
            ..SandboxFilter::default()
        };
        assert_eq!(
            list(by_labels(&[("team", None)])).await,
            expect(&rows, |s| s.labels.contains_key("team"))
        );
        assert_eq!(
            list(by_labels(&[("team", Some("infra"))])).await,
            expect(&rows, |s| s.labels.get("team").map(String::as_str)
                == Some("infra"))
        );
        assert_eq!(
            list(by_labels(&[("team", Some("infra")), ("env", Some("prod"))])).await,
            expect(&rows, |s| s.name == "alpha")
        );
        assert_eq!(
            list(by_labels(&[("env", None), ("team", Some("web"))])).await,
            expect(&rows, |s| s.name == "gamma-1")
        );
        // An empty value is a value, and present.
        assert_eq!(
            list(by_labels(&[("x", Some(""))])).await,
            expect(&rows, |s| s.name == "zeta")
        );
        assert_eq!(list(by_labels(&[("missing", None)])).await, HashSet::new());

        let f = SandboxFilter {
            created_by: Some("alice".into()),
            ..SandboxFilter::default()
        };
        assert_eq!(list(f).await, expect(&rows, |s| s.created_by == "alice"));

        // Filters combine.
        let f = SandboxFilter {
            created_by: Some("alice".into()),
            status: Some(SandboxStatus::Stopped),
            labels: vec![("team".into(), None)],
            ..SandboxFilter::default()
        };
        assert_eq!(
            list(f).await,
            expect(&rows, |s| s.created_by == "alice"
                && s.status == SandboxStatus::Stopped
                && s.labels.contains_key("team"))
        );
    });
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum K {
    I(i64),
    T(String),
}

type KeyFn = fn(&SandboxRow) -> K;

#[tokio::test]
async fn every_sort_key_and_order_pages_consistently() {
    each_backend!(|db| {
        let (ws, rows) = fixture(db).await;
        let sorts: [(SandboxSort, KeyFn); 6] = [
            (SandboxSort::Name, |s| K::T(s.name.clone())),
            (SandboxSort::Status, |s| K::T(s.status.as_str().to_owned())),
            (SandboxSort::CreatedAt, |s| K::I(s.created_at.unix_ms())),
            (SandboxSort::StoppedAt, |s| {
                K::I(s.stopped_at.map_or(0, |t| t.unix_ms()))
            }),
            (SandboxSort::IdleTtl, |s| K::I(s.idle_ttl.as_secs() as i64)),
            (SandboxSort::DeleteAfterStop, |s| {
                K::I(s.delete_after_stop.as_secs() as i64)
            }),
        ];
        for (sort, key) in sorts {
            for order in [SortOrder::Asc, SortOrder::Desc] {
                let mut expected: Vec<&SandboxRow> = rows.iter().collect();
                expected.sort_by_key(|a| (key(a), a.id));
                if order == SortOrder::Desc {
                    expected.reverse();
                }
                let expected: Vec<String> = expected.iter().map(|s| s.name.clone()).collect();
                for page_size in [2, 4, 100] {
                    let f = SandboxFilter {
                        sort_by: sort,
                        sort_order: order,
                        page_size,
                        ..SandboxFilter::default()
                    };
                    let (names, pages) = walk(db, ws, f).await;
                    assert_eq!(names, expected, "{sort:?} {order:?} page size {page_size}");
                    assert_eq!(pages, rows.len().div_ceil(page_size as usize).max(1));
                }
            }
        }
        // The default is newest first.
        let (names, _) = walk(db, ws, SandboxFilter::default()).await;
        let (desc, _) = walk(
            db,
            ws,
            SandboxFilter {
                sort_by: SandboxSort::CreatedAt,
                sort_order: SortOrder::Desc,
                ..SandboxFilter::default()
            },
        )
        .await;
        assert_eq!(names, desc);
    });
}

#[tokio::test]
async fn pagination_walks_250_rows_exactly_once_despite_inserts() {
    each_backend!(|db| {
        let ws = workspace(db, Quotas::default()).await.id;
        let base = 1_800_000_000_000;
        for i in 0..250 {
            let mut s = sandbox(ws, &format!("sb-{i:03}"));
            s.created_at = Timestamp::from_unix_ms(base + i / 4);
            db.insert_sandbox(&s).await.unwrap();
        }
        for order in [SortOrder::Desc, SortOrder::Asc] {
            let mut f = SandboxFilter {
                sort_order: order,
                page_size: 100,
                ..SandboxFilter::default()
            };
            let mut seen = Vec::new();
            let mut sizes = Vec::new();
            loop {
                let page = db.list_sandboxes(ws, &f).await.unwrap();
                sizes.push(page.items.len());
                seen.extend(page.items.into_iter().map(|s| s.name));
                // Rows inserted mid-walk, newer and older than everything,
                // must not shift the walk.
                for (tag, at) in [("new", base + 10_000), ("old", base - 10_000)] {
                    let mut s = sandbox(ws, &format!("{tag}-{order:?}-{}", sizes.len()));
                    s.created_at = Timestamp::from_unix_ms(at);
                    db.insert_sandbox(&s).await.unwrap();
                }
                match page.next_cursor {
                    Some(c) => f.cursor = Some(c),
                    None => break,
                }
            }
            let originals: Vec<&String> = seen.iter().filter(|n| n.starts_with("sb-")).collect();
            let unique: HashSet<&String> = seen.iter().collect();
            assert_eq!(unique.len(), seen.len(), "a row repeated ({order:?})");
            assert_eq!(originals.len(), 250, "{order:?}");
            assert_eq!(&sizes[..2], &[100, 100], "{order:?}");
        }
        // Without inserts: exactly 100 + 100 + 50 (the ws now holds more
        // rows, so filter to the originals).
        let mut f2 = SandboxFilter {
            name_contains: Some("sb-".into()),
            page_size: 100,
            ..SandboxFilter::default()
        };
        let mut sizes = Vec::new();
        loop {
            let page = db.list_sandboxes(ws, &f2).await.unwrap();
            sizes.push(page.items.len());
            match page.next_cursor {
                Some(c) => f2.cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(sizes, [100, 100, 50]);
    });
}

#[tokio::test]
async fn bad_cursors_are_rejected() {
    each_backend!(|db| {
        let ws = workspace(db, Quotas::default()).await.id;
        for i in 0..3 {
            db.insert_sandbox(&sandbox(ws, &format!("c{i}")))
                .await
                .unwrap();
        }
        let first = db
            .list_sandboxes(
                ws,
                &SandboxFilter {
                    page_size: 1,
                    ..SandboxFilter::default()
                },
            )
            .await
            .unwrap();
        let cursor = first.next_cursor.expect("more pages");
        for (bad, sort) in [
            ("not hex".to_owned(), SandboxSort::CreatedAt),
            ("7b7d".to_owned(), SandboxSort::CreatedAt),
            (cursor.clone(), SandboxSort::Name),
        ] {
            let f = SandboxFilter {
                cursor: Some(bad),
                sort_by: sort,
                ..SandboxFilter::default()
            };
            assert!(matches!(
                db.list_sandboxes(ws, &f).await,
                Err(DbError::InvalidCursor)
            ));
        }
    });
}
