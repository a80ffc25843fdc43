//! Large hashes, sets and sorted sets stored as parts (`parts_bytes_min`): one record of
//! the `parts` family per member, so a change to a few members writes those, on the real
//! RocksDB.

use std::sync::Arc;

use bytes::Bytes;
use strata_engine::{Answer, Asked, Change, Engine, ErrorKind, Kind, LiveValue, Tier};
use strata_format::delta::encode_delta;
use strata_format::members::{decode_members, encode_members};
use strata_format::zset::{decode_zset, encode_zset, MemberBound, Pick, ScoreBound, ScoreWindow};
use strata_warm::{Bounds, Family, WarmStore};

use crate::support::{key, live_as, members, parts, small_options, Opts};

/// A set that notes its changes, as the server's live sets do: the members added and
/// removed since it was last encoded or its delta taken.
#[derive(Default)]
struct NotingSet {
    members: Vec<Vec<u8>>,
    added: Vec<Vec<u8>>,
    removed: Vec<Vec<u8>>,
}

impl NotingSet {
    fn decode(v: Option<&Bytes>) -> strata_engine::Result<Box<dyn LiveValue>> {
        Ok(Box::new(NotingSet {
            members: v.map_or_else(Vec::new, |v| members(v)),
            ..Default::default()
        }))
    }

    fn add(&mut self, m: &[u8]) -> bool {
        if self.members.iter().any(|x| x == m) {
            return false;
        }
        self.members.push(m.to_vec());
        self.added.push(m.to_vec());
        true
    }

    fn remove(&mut self, m: &[u8]) -> bool {
        let Some(i) = self.members.iter().position(|x| x == m) else {
            return false;
        };
        self.members.remove(i);
        self.added.retain(|x| x != m);
        self.removed.push(m.to_vec());
        true
    }
}

impl LiveValue for NotingSet {
    fn encode(&mut self) -> Bytes {
        self.added.clear();
        self.removed.clear();
        encode_members(&self.members).into()
    }
    fn delta(&mut self) -> Option<Vec<u8>> {
        let puts = encode_members(&std::mem::take(&mut self.added));
        Some(encode_delta(&puts, &std::mem::take(&mut self.removed)))
    }
    fn bytes(&self) -> usize {
        self.members.iter().map(|m| m.len() + 24).sum()
    }
    fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
    fn items(&self) -> Option<usize> {
        Some(self.members.len())
    }
}

fn member(i: usize) -> Vec<u8> {
    format!("member:{i:05}").into_bytes()
}

/// Options where a set of a few hundred members is stored as parts and may be live.
fn options(dir: &std::path::Path) -> Opts {
    let mut o = small_options(dir);
    o.s.hot.hot_bytes_max = 64 << 20;
    o.s.warm.warm_bytes_max = 1 << 30;
    o.s.warm.parts_bytes_min = 4 << 10;
    o
}

/// Opens the store, keeping a handle on its warm store to count parts with.
async fn open_counting(o: Opts) -> (Engine, Arc<dyn WarmStore>) {
    let p = parts(o);
    let warm = p.warm.clone();
    (Engine::open_with(p).await.unwrap(), warm)
}

fn parts_held(warm: &Arc<dyn WarmStore>) -> usize {
    let mut c = warm.cursor(Family::Parts, Bounds::all(), None);
    c.seek_to_first();
    let mut n = 0;
    while c.valid() {
        n += 1;
        c.next();
    }
    c.status().unwrap();
    n
}

async fn members_of(e: &Engine, k: &strata_format::Key) -> Vec<Vec<u8>> {
    let (kind, v) = e.get_value(k).await.unwrap().expect("the set is there");
    assert_eq!(kind, Kind::Set);
    let mut m = members(&v);
    m.sort();
    m
}

async fn change(e: &Engine, k: &strata_format::Key, f: impl FnOnce(&mut NotingSet) -> bool) {
    e.update_live(k, Kind::Set, NotingSet::decode, |v| {
        Ok((f(live_as::<NotingSet>(v)), ()))
    })
    .await
    .unwrap()
    .durable(e)
    .await
    .unwrap();
}

/// Writes the set of `members` at `k` whole (not through a live value), expiring at
/// `expire_ms`, durably.
async fn put_whole(e: &Engine, k: &strata_format::Key, members: &[Vec<u8>], expire_ms: u64) {
    let value = Bytes::from(encode_members(members));
    put_kind(e, k, Kind::Set, value, expire_ms).await;
}

/// Writes `value` of `kind` at `k` whole, expiring at `expire_ms`, durably.
async fn put_kind(e: &Engine, k: &strata_format::Key, kind: Kind, value: Bytes, expire_ms: u64) {
    let put = Change::Put {
        kind,
        value,
        expire_ms,
    };
    e.update(k, false, move |_| Ok((Some(put), ())))
        .await
        .unwrap()
        .durable(e)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_set_is_stored_as_parts_and_its_folds_write_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    let k = key("big");
    let mut want: Vec<Vec<u8>> = (0..2000).map(member).collect();
    {
        let (e, warm) = open_counting(options(dir.path())).await;
        change(&e, &k, |s| {
            (0..2000).for_each(|i| {
                s.add(&member(i));
            });
            true
        })
        .await;
        // A read folds it: 40 KB of members, past `parts_bytes_min`, stored one by one.
        assert_eq!(members_of(&e, &k).await, want);
        assert_eq!(e.stats_now().parts_written, 2000);
        assert_eq!(parts_held(&warm), 2000);

        // Two members change: the next fold writes those two, not the set again.
        change(&e, &k, |s| s.add(b"member:99999") && s.remove(&member(1))).await;
        want.remove(1);
        want.push(b"member:99999".to_vec());
        assert_eq!(members_of(&e, &k).await, want);
        assert_eq!(e.stats_now().parts_written, 2002);
        assert_eq!(parts_held(&warm), 2000);
        e.close().await.unwrap();
    }

    // Read back after a restart (not live: the parts put together), then changed again.
    let (e, warm) = open_counting(options(dir.path())).await;
    assert_eq!(members_of(&e, &k).await, want);
    change(&e, &k, |s| s.remove(&member(2))).await;
    want.remove(1);
    assert_eq!(members_of(&e, &k).await, want);
    assert_eq!(
        e.stats_now().parts_written,
        1,
        "a live value made from parts writes its delta"
    );

    // A whole write of something else in its place leaves no part behind.
    e.put(&k, Bytes::from_static(b"a string now"), Default::default())
        .await
        .unwrap()
        .durable(&e)
        .await
        .unwrap();
    // Write-back took it: the parts go once it reaches the warm store.
    e.clear_hot();
    assert_eq!(parts_held(&warm), 0);
    assert_eq!(
        e.get(&k).await.unwrap().as_deref(),
        Some(&b"a string now"[..])
    );
    e.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_write_of_a_large_set_is_checked_parts_kept_warm_that_delete_and_expiry_clear() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    // No write-back, so no live values: every write of the set is a whole write.
    o.s.hot.hot_dirty_fraction = 0.0;
    // Demotion wants the warm tier nearly empty.
    o.s.warm.warm_bytes_max = 1 << 10;
    let (e, warm) = open_counting(o).await;
    let (k, small) = (key("big"), key("small"));
    let members: Vec<Vec<u8>> = (0..1000).map(member).collect();
    for (key, members) in [(&k, &members[..]), (&small, &members[..3])] {
        put_whole(&e, key, members, 0).await;
    }
    // Only the large one is parts.
    assert_eq!(parts_held(&warm), 1000);
    assert_eq!(members_of(&e, &k).await, members);
    assert_eq!(members_of(&e, &small).await, members[..3].to_vec());

    // A part whose bytes changed on disk fails its checksum: the read is refused.
    let first = {
        let mut c = warm.cursor(Family::Parts, Bounds::all(), None);
        c.seek_to_first();
        (c.key().to_vec(), c.value().to_vec())
    };
    let mut bad = first.1.clone();
    *bad.last_mut().unwrap() ^= 0x20;
    let mut b = warm.batch();
    b.put(Family::Parts, &first.0, &bad);
    warm.write(b, true).unwrap();
    e.clear_hot();
    let err = e
        .get_value(&k)
        .await
        .expect_err("a changed part is not returned");
    assert_eq!(err.kind(), ErrorKind::Data, "{err}");
    // A count is the record's: no part is read (the damaged one is not seen). A value not
    // stored as parts is read.
    let count = e
        .get_asked_with(&k, Asked::Count, |_, _| Ok(0))
        .await
        .unwrap();
    assert_eq!(count, Some(Answer::Items(Kind::Set, 1000)));
    let count = e.get_asked_with(&small, Asked::Count, |_, v| {
        Ok(decode_members(v.bytes()).unwrap().len())
    });
    assert_eq!(count.await.unwrap(), Some(Answer::Read(3)));
    let mut b = warm.batch();
    b.put(Family::Parts, &first.0, &first.1);
    warm.write(b, true).unwrap();
    assert_eq!(members_of(&e, &k).await, members);

    // Demotion passes the parts over: the small set goes cold, the large one stays warm.
    e.clear_hot();
    e.run_background_once().await.unwrap();
    assert_eq!(e.tier_of(&small).await.unwrap(), Some(Tier::Cold));
    assert_eq!(e.tier_of(&k).await.unwrap(), Some(Tier::Warm));
    assert_eq!(members_of(&e, &k).await, members);

    // An expiry keeps the parts; the delete clears them.
    assert!(e.set_expire(&k, u64::MAX / 2).await.unwrap().value);
    assert_eq!(members_of(&e, &k).await, members);
    assert_eq!(parts_held(&warm), 1000);
    assert!(e.delete(&k).await.unwrap().value);
    assert_eq!(parts_held(&warm), 0);
    assert_eq!(e.get_value(&k).await.unwrap(), None);

    // The expiry sweep clears the parts of a set whose time came.
    put_whole(&e, &k, &members, e.now_ms() + 50).await;
    assert_eq!(parts_held(&warm), 1000);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    e.run_background_once().await.unwrap();
    assert_eq!(parts_held(&warm), 0);
    assert_eq!(e.get_value(&k).await.unwrap(), None);
    e.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_sorted_set_is_stored_as_parts_by_member_and_read_back_by_score() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    o.s.hot.hot_dirty_fraction = 0.0;
    let (e, warm) = open_counting(o).await;
    let k = key("ranked");
    // Scores that run against the members' order: parts, kept by member, are not in
    // the set's order.
    let entries: Vec<(f64, Vec<u8>)> = (0..1000)
        .map(|i| ((1000 - i) as f64 / 4.0, member(i)))
        .collect();
    // And a few of one score, ordered by member.
    let entries: Vec<(f64, Vec<u8>)> = entries
        .into_iter()
        .chain((0..4).map(|i| (100.0, format!("tie:{i}").into_bytes())))
        .collect();
    let mut ordered = entries.clone();
    ordered.sort_by(strata_format::zset::order);
    let value = Bytes::from(encode_zset(&ordered));
    put_kind(&e, &k, Kind::ZSet, value.clone(), 0).await;
    assert_eq!(parts_held(&warm), 1004);
    e.clear_hot();
    let (kind, back) = e.get_value(&k).await.unwrap().unwrap();
    assert_eq!(kind, Kind::ZSet);
    assert_eq!(back, value, "put back together in score order");

    // Read by name: the entries named alone, whatever order they are named in.
    e.clear_hot();
    let names = [member(7), member(3), b"absent".to_vec()];
    let got = e
        .get_named_with(&k, &names, |kind, v| {
            assert_eq!(kind, Kind::ZSet);
            let got: Vec<(f64, Vec<u8>)> = decode_zset(v.bytes())
                .unwrap()
                .into_iter()
                .map(|(s, m)| (s, m.to_vec()))
                .collect();
            Ok(got)
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        got,
        vec![(993.0 / 4.0, member(7)), (997.0 / 4.0, member(3))]
    );

    // Range reads walk the score index: each window's entries, as the set in order picks them.
    let windows = [
        (Pick::Ranks { start: 0, stop: 4 }, false),
        (Pick::Ranks { start: 0, stop: 4 }, true),
        (
            Pick::Ranks {
                start: -3,
                stop: -1,
            },
            false,
        ),
        (
            Pick::Ranks {
                start: 995,
                stop: 2000,
            },
            true,
        ),
        (Pick::Ranks { start: 5, stop: 2 }, false),
        // Nearer the far end: walked from there.
        (
            Pick::Ranks {
                start: -1,
                stop: -1,
            },
            false,
        ),
        (ranks(990, -3), true),
        (ranks(600, 700), false),
        (ranks(300, 1003), true),
        (scores(100.0, false, 101.0, false, 0, None), false),
        (scores(100.0, true, 101.0, true, 0, None), false),
        (scores(100.0, false, 110.0, true, 3, Some(5)), false),
        (scores(100.0, false, 110.0, true, 3, Some(5)), true),
        (scores(f64::NEG_INFINITY, false, 0.5, false, 0, None), true),
        (scores(249.0, true, f64::INFINITY, false, 0, None), false),
        (scores(300.0, false, 200.0, false, 0, None), false),
    ];
    check_windows(&e, &k, &ordered, &windows).await;
    assert!(e.delete(&k).await.unwrap().value);
    assert_eq!(parts_held(&warm), 0);
    e.close().await.unwrap();
}

fn scores(
    min: f64,
    min_ex: bool,
    max: f64,
    max_ex: bool,
    offset: usize,
    count: Option<usize>,
) -> Pick<'static> {
    let bound = |value, exclusive| ScoreBound { value, exclusive };
    Pick::Scores {
        min: bound(min, min_ex),
        max: bound(max, max_ex),
        offset,
        count,
    }
}

/// Reads each of `windows` of the sorted set `k` (not in DRAM) from its score index and
/// checks it against what the set in order (`ordered`) holds.
async fn check_windows(
    e: &Engine,
    k: &strata_format::Key,
    ordered: &[(f64, Vec<u8>)],
    windows: &[(Pick<'_>, bool)],
) {
    for &(pick, rev) in windows {
        let window = ScoreWindow { pick, rev };
        e.clear_hot();
        let got = e
            .get_asked_with(k, Asked::Window(&window), |_, _| Ok(()))
            .await
            .unwrap();
        let Some(Answer::Entries(Kind::ZSet, got)) = got else {
            panic!("{window:?}: not read from the index: {got:?}");
        };
        let got: Vec<(f64, Vec<u8>)> = got.into_iter().map(|(s, m)| (s, m.to_vec())).collect();
        assert_eq!(got, picked(ordered, &window), "{window:?}");
    }
}

/// What `window` picks from `ordered` (the whole set in order), written plainly.
fn picked(ordered: &[(f64, Vec<u8>)], window: &ScoreWindow<'_>) -> Vec<(f64, Vec<u8>)> {
    let mut walk: Vec<(f64, Vec<u8>)> = ordered.to_vec();
    if window.rev {
        walk.reverse();
    }
    match window.pick {
        Pick::Ranks { start, stop } => {
            let len = walk.len() as i64;
            let at = |i: i64| if i < 0 { len + i } else { i };
            let (s, e) = (at(start).max(0), at(stop).min(len - 1));
            if s > e {
                return Vec::new();
            }
            walk[s as usize..=e as usize].to_vec()
        }
        Pick::Scores {
            min,
            max,
            offset,
            count,
        } => walk
            .into_iter()
            .filter(|(s, _)| min.admits_above(*s) && max.admits_below(*s))
            .skip(offset)
            .take(count.unwrap_or(usize::MAX))
            .collect(),
        Pick::Members {
            min,
            max,
            offset,
            count,
        } => walk
            .into_iter()
            .filter(|(_, m)| min.admits_above(m) && max.admits_below(m))
            .skip(offset)
            .take(count.unwrap_or(usize::MAX))
            .collect(),
    }
}

/// An expiry set through write-back leaves the key's newer state in DRAM (dirty, with the
/// expiry) and its older one in the warm store. Once the expiry passes, reads by name,
/// counts and ranges say the key is gone, as a whole read does, and do not answer from
/// the warm store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_a_few_items_see_an_expiry_waiting_in_dram() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open_with(parts(options(dir.path()))).await.unwrap();
    let (set, ranked) = (key("set"), key("ranked"));
    put_whole(&e, &set, &[member(1), member(2)], 0).await;
    let value = Bytes::from(encode_zset(&[(1.0, member(1))]));
    put_kind(&e, &ranked, Kind::ZSet, value, 0).await;
    // Only the warm store holds them; then the expiries wait in DRAM.
    e.clear_hot();
    for k in [&set, &ranked] {
        assert!(e.set_expire(k, e.now_ms() + 50).await.unwrap().value);
    }
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let none = |_: Kind, _: strata_engine::Source<'_>| -> strata_engine::Result<()> {
        panic!("an expired key's value was read")
    };
    assert_eq!(
        e.get_named_with(&set, &[member(1)], none).await.unwrap(),
        None
    );
    assert_eq!(
        e.get_asked_with(&set, Asked::Count, none).await.unwrap(),
        None
    );
    let window = ScoreWindow {
        pick: Pick::Ranks { start: 0, stop: -1 },
        rev: false,
    };
    assert_eq!(
        e.get_asked_with(&ranked, Asked::Window(&window), none)
            .await
            .unwrap(),
        None
    );
    assert_eq!(e.get_value(&set).await.unwrap(), None);
    e.close().await.unwrap();
}

fn ranks(start: i64, stop: i64) -> Pick<'static> {
    Pick::Ranks { start, stop }
}

/// A list that notes its changes as the server's live lists do
/// ([`strata_format::delta::ListDelta`], in order).
#[derive(Default)]
struct NotingList {
    elements: std::collections::VecDeque<Vec<u8>>,
    ops: strata_format::delta::ListDelta,
}

impl NotingList {
    fn decode(v: Option<&Bytes>) -> strata_engine::Result<Box<dyn LiveValue>> {
        Ok(Box::new(NotingList {
            elements: v.map_or_else(Vec::new, |v| members(v)).into(),
            ..Default::default()
        }))
    }
}

impl LiveValue for NotingList {
    fn encode(&mut self) -> Bytes {
        self.ops = Default::default();
        encode_members(&self.elements.iter().collect::<Vec<_>>()).into()
    }
    fn delta(&mut self) -> Option<Vec<u8>> {
        Some(std::mem::take(&mut self.ops).finish())
    }
    fn bytes(&self) -> usize {
        self.elements.iter().map(|m| m.len() + 24).sum()
    }
    fn is_empty(&self) -> bool {
        self.elements.is_empty()
    }
    fn items(&self) -> Option<usize> {
        Some(self.elements.len())
    }
}

/// One change of a list: what a command did, on the list and in its notes.
fn list_op(l: &mut NotingList, what: u64, r: u64, e: &[u8]) {
    let len = l.elements.len();
    let i = r as usize % len.max(1);
    match what % 7 {
        0 => {
            l.elements.push_front(e.to_vec());
            l.ops.push_front(e);
        }
        2 if len > 1 => {
            l.elements.pop_front();
            l.ops.pop_front(1);
        }
        3 if len > 2 => {
            l.elements.truncate(len - 2);
            l.ops.pop_back(2);
        }
        4 if len > 0 => {
            l.elements[i] = e.to_vec();
            l.ops.set(i, e);
        }
        5 => {
            let i = r as usize % (len + 1);
            l.elements.insert(i, e.to_vec());
            l.ops.insert(i, e);
        }
        6 if len > 1 => {
            l.elements.remove(i);
            l.ops.remove(i);
        }
        _ => {
            l.elements.push_back(e.to_vec());
            l.ops.push_back(e);
        }
    }
}

async fn elements_of(e: &Engine, k: &strata_format::Key) -> Vec<Vec<u8>> {
    let (kind, v) = e.get_value(k).await.unwrap().expect("the list is there");
    assert_eq!(kind, Kind::List);
    members(&v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_list_is_stored_as_parts_by_position_and_its_changes_write_what_moved() {
    let dir = tempfile::tempdir().unwrap();
    let k = key("queue");
    let mut model: std::collections::VecDeque<Vec<u8>> = (0..1000).map(member).collect();
    let change_list = |e: &Engine, f: Box<dyn FnOnce(&mut NotingList) + Send>| {
        let e = e.clone();
        let k = k.clone();
        async move {
            e.update_live(&k, Kind::List, NotingList::decode, |v| {
                f(live_as::<NotingList>(v));
                Ok((true, ()))
            })
            .await
            .unwrap()
            .durable(&e)
            .await
            .unwrap();
        }
    };
    let first: Vec<Vec<u8>> = model.iter().cloned().collect();
    {
        let (e, warm) = open_counting(options(dir.path())).await;
        change_list(
            &e,
            Box::new(move |l| first.iter().for_each(|m| list_op(l, 1, 0, m))),
        )
        .await;
        assert_eq!(elements_of(&e, &k).await, Vec::from(model.clone()));
        assert_eq!(parts_held(&warm), 1000);

        // A push at each end writes two parts, not the list; a pop deletes one.
        let before = e.stats_now().parts_written;
        change_list(
            &e,
            Box::new(|l| {
                list_op(l, 0, 0, b"head");
                list_op(l, 1, 0, b"tail");
            }),
        )
        .await;
        model.push_front(b"head".to_vec());
        model.push_back(b"tail".to_vec());
        assert_eq!(elements_of(&e, &k).await, Vec::from(model.clone()));
        assert_eq!(e.stats_now().parts_written - before, 2);
        change_list(&e, Box::new(|l| list_op(l, 2, 0, b""))).await;
        model.pop_front();
        assert_eq!(elements_of(&e, &k).await, Vec::from(model.clone()));
        assert_eq!(e.stats_now().parts_written - before, 3);
        assert_eq!(parts_held(&warm), 1001);

        // Seeded rounds of every change, each checked against the model whole and by span.
        let mut seed = 7u64;
        let mut next = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            seed >> 33
        };
        for round in 0..40 {
            let ops: Vec<(u64, u64, Vec<u8>)> = (0..1 + next() % 8)
                .map(|j| (next(), next(), format!("r{round}:{j}").into_bytes()))
                .collect();
            let mut m = NotingList {
                elements: model.clone(),
                ..Default::default()
            };
            ops.iter().for_each(|(w, r, x)| list_op(&mut m, *w, *r, x));
            model = m.elements;
            change_list(
                &e,
                Box::new(move |l| {
                    ops.iter().for_each(|(w, r, x)| list_op(l, *w, *r, x));
                }),
            )
            .await;
            assert_eq!(
                elements_of(&e, &k).await,
                Vec::from(model.clone()),
                "round {round}"
            );
            assert_eq!(parts_held(&warm), model.len(), "round {round}");
        }
        e.close().await.unwrap();
    }

    // After a restart: spans read those elements alone, from the parts.
    let (e, _warm) = open_counting(options(dir.path())).await;
    let len = model.len() as i64;
    let spans = [
        (0, 9),
        (-10, -1),
        (500, 502),
        (7, 7),
        (-1, -1),
        (0, -1),
        (5, 2),
        (len, len + 5),
        (-len - 9, 0),
    ];
    for (start, stop) in spans {
        e.clear_hot();
        let got = e
            .get_asked_with(&k, Asked::Span(start, stop), |_, _| Ok(()))
            .await
            .unwrap();
        let Some(Answer::Elements(Kind::List, got)) = got else {
            panic!("{start}..{stop}: not read from the parts: {got:?}");
        };
        let got: Vec<Vec<u8>> = got.into_iter().map(|b| b.to_vec()).collect();
        let want: Vec<Vec<u8>> = match strata_format::zset::rank_window(model.len(), start, stop) {
            Some((s, t)) => model.range(s..=t).cloned().collect(),
            None => Vec::new(),
        };
        assert_eq!(got, want, "{start}..{stop}");
    }
    let count = e
        .get_asked_with(&k, Asked::Count, |_, _| Ok(0))
        .await
        .unwrap();
    assert_eq!(count, Some(Answer::Items(Kind::List, model.len() as u64)));
    // A span of something else is not a list's.
    put_whole(&e, &key("set"), &[member(1)], 0).await;
    e.clear_hot();
    let other = e
        .get_asked_with(&key("set"), Asked::Span(0, -1), |_, _| Ok(()))
        .await
        .unwrap();
    assert!(
        !matches!(other, Some(Answer::Elements(Kind::List, _))),
        "{other:?}"
    );

    // Made live from its parts and changed: its delta is written.
    change_list(&e, Box::new(|l| list_op(l, 0, 0, b"again"))).await;
    model.push_front(b"again".to_vec());
    assert_eq!(elements_of(&e, &k).await, Vec::from(model.clone()));
    assert_eq!(e.stats_now().parts_written, 1, "one push, one part");
    e.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_score_of_minus_zero_reads_back_from_the_score_index_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    o.s.warm.parts_bytes_min = 1;
    let e = Engine::open_with(parts(o)).await.unwrap();
    let k = key("signs");
    // Redis orders -0 as 0: by member among equal scores.
    let ordered: Vec<(f64, &[u8])> = vec![(-1.0, b"c"), (0.0, b"a"), (-0.0, b"b"), (0.0, b"d")];
    put_kind(&e, &k, Kind::ZSet, Bytes::from(encode_zset(&ordered)), 0).await;
    e.clear_hot();
    let window = ScoreWindow {
        pick: ranks(0, -1),
        rev: false,
    };
    let got = e
        .get_asked_with(&k, Asked::Window(&window), |_, _| Ok(()))
        .await
        .unwrap();
    let Some(Answer::Entries(Kind::ZSet, got)) = got else {
        panic!("not read from the index: {got:?}");
    };
    let got: Vec<(u64, &[u8])> = got.iter().map(|(s, m)| (s.to_bits(), &m[..])).collect();
    let want: Vec<(u64, &[u8])> = ordered.iter().map(|(s, m)| (s.to_bits(), *m)).collect();
    assert_eq!(got, want);
    e.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lex_ranges_of_a_large_sorted_set_of_one_score_walk_its_score_index() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    o.s.hot.hot_dirty_fraction = 0.0;
    let (e, _warm) = open_counting(o).await;
    let (k, mixed) = (key("words"), key("mixed"));
    // Every score 0, as lex ranges assume (an autocomplete index).
    let ordered: Vec<(f64, Vec<u8>)> = (0..1000).map(|i| (0.0, member(i))).collect();
    put_kind(&e, &k, Kind::ZSet, Bytes::from(encode_zset(&ordered)), 0).await;
    let (a, b) = (member(100), member(200));
    let lex = |min, max, offset, count| Pick::Members {
        min,
        max,
        offset,
        count,
    };
    use MemberBound::{Excl, Incl, Max, Min};
    let windows = [
        (lex(Min, Max, 0, Some(5)), false),
        (lex(Min, Max, 0, Some(5)), true),
        (lex(Incl(&a), Incl(&b), 0, None), false),
        (lex(Excl(&a), Excl(&b), 0, None), true),
        (lex(Incl(&a), Incl(&b), 0, Some(3)), true),
        (lex(Incl(&a), Max, 10, Some(3)), false),
        (lex(Min, Excl(&b), 2, Some(4)), true),
        (
            lex(Incl(b"member:00100x"), Incl(b"member:00102"), 0, None),
            false,
        ),
        (lex(Incl(&b), Incl(&a), 0, None), false),
        (lex(Max, Max, 0, None), false),
        (lex(Min, Min, 0, None), true),
        (lex(Excl(b"member:99999"), Max, 0, None), false),
    ];
    check_windows(&e, &k, &ordered, &windows).await;
    // Scores that differ: the index is not in member order, so the whole set answers.
    let two: Vec<(f64, Vec<u8>)> = (0..1000).map(|i| ((i % 2) as f64, member(i))).collect();
    let mut two_ordered = two.clone();
    two_ordered.sort_by(strata_format::zset::order);
    put_kind(
        &e,
        &mixed,
        Kind::ZSet,
        Bytes::from(encode_zset(&two_ordered)),
        0,
    )
    .await;
    e.clear_hot();
    let window = ScoreWindow {
        pick: lex(Min, Max, 0, None),
        rev: false,
    };
    let got = e
        .get_asked_with(&mixed, Asked::Window(&window), |_, _| Ok("whole"))
        .await;
    assert_eq!(got.unwrap(), Some(Answer::Read("whole")));
    e.close().await.unwrap();
}
