use strata_warm::{Family, RawChange, StoreError, WarmStore};

use crate::{RocksSettings, RocksWarm};

fn put(family: Family, key: &str, value: &str) -> RawChange {
    RawChange::Put {
        family,
        key: key.into(),
        value: value.into(),
    }
}

#[test]
fn every_batch_comes_back_with_its_sequence_and_changes() {
    let dir = tempfile::tempdir().unwrap();
    let s = RocksWarm::open(dir.path(), &RocksSettings::default()).unwrap();
    let start = s.last_sequence();
    let mut b = s.batch();
    b.put(Family::Records, b"a", b"1");
    b.put(Family::Cold, b"a", b"ref");
    s.write(b, false).unwrap();
    let mut b = s.batch();
    b.delete(Family::Records, b"a");
    b.merge(Family::Meta, b"n", &3i64.to_le_bytes());
    b.delete_range(Family::Expiry, b"a", b"z");
    s.write(b, true).unwrap();
    let mut b = s.batch();
    b.put(Family::Parts, &[0u8; 300], &vec![9u8; 200_000]);
    s.write(b, false).unwrap();

    let all: Vec<_> = s
        .changes_after(start)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(all.len(), 3, "the first batch is not skipped");
    assert_eq!(all[0].sequence, start + 1);
    assert_eq!(
        all[0].changes,
        vec![
            put(Family::Records, "a", "1"),
            put(Family::Cold, "a", "ref")
        ]
    );
    assert_eq!(all[1].sequence, start + 3);
    assert_eq!(
        all[1].changes,
        vec![
            RawChange::Delete {
                family: Family::Records,
                key: b"a".to_vec()
            },
            RawChange::Merge {
                family: Family::Meta,
                key: b"n".to_vec(),
                operand: 3i64.to_le_bytes().to_vec()
            },
            RawChange::DeleteRange {
                family: Family::Expiry,
                from: b"a".to_vec(),
                to: b"z".to_vec()
            },
        ]
    );
    assert_eq!(all[2].sequence, start + 6);
    assert!(matches!(&all[2].changes[0], RawChange::Put { value, .. } if value.len() == 200_000));
    assert_eq!(all[2].last_sequence(), s.last_sequence());

    // From the middle: what follows the second batch only.
    let rest: Vec<_> = s
        .changes_after(all[1].last_sequence())
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(rest, all[2..].to_vec());
    assert_eq!(s.changes_after(s.last_sequence()).unwrap().count(), 0);
}

#[test]
fn the_log_survives_a_reopen_and_flushed_logs_are_gone_without_retention() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = RocksWarm::open(dir.path(), &RocksSettings::default()).unwrap();
        let mut b = s.batch();
        b.put(Family::Records, b"k", b"v");
        s.write(b, true).unwrap();
    }
    let s = RocksWarm::open(dir.path(), &RocksSettings::default()).unwrap();
    let got: Vec<_> = s.changes_after(0).unwrap().map(Result::unwrap).collect();
    assert_eq!(
        got.last().unwrap().changes,
        vec![put(Family::Records, "k", "v")]
    );

    let dir = tempfile::tempdir().unwrap();
    let none = RocksSettings {
        change_log_bytes_max: 0,
        ..RocksSettings::default()
    };
    let s = RocksWarm::open(dir.path(), &none).unwrap();
    let mut b = s.batch();
    b.put(Family::Records, b"k", b"v");
    s.write(b, true).unwrap();
    s.flush().unwrap();
    let mut b = s.batch();
    b.put(Family::Records, b"k2", b"v");
    s.write(b, true).unwrap();
    let got: Vec<_> = s.changes_after(0).unwrap().collect();
    assert!(
        matches!(got.first(), Some(Err(StoreError::Gone(_))))
            || got.iter().all(|c| c.as_ref().unwrap().sequence > 1),
        "{got:?}"
    );
}
