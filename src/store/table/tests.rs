//! The table's index, partitions and sweep, through the store.

use super::*;
use crate::limiter::State;
use crate::store::tests::put;
use crate::store::{Holder, Holders, Semaphore};

#[test]
fn keys_of_one_partition_spread_over_every_index_tag() {
    // The index compares a key only where a slot's 7-bit tag (the top bits of the hash it
    // was given) matches. If the partition's own bits fed the tag, a partition's keys
    // would share most of it, and a probe would read and compare about half the slots it
    // passes.
    let s = Store::new(0, 0);
    let mut tags = std::collections::HashSet::new();
    let mut starts = std::collections::HashSet::new();
    for i in 0..200_000u32 {
        let hash = s.hash(format!("bucket:{i}").as_bytes());
        if Store::partition_of(hash) == 5 {
            tags.insert(index_hash(hash) >> 57);
            starts.insert(index_hash(hash) & 1023);
        }
    }
    assert_eq!(tags.len(), 128, "tags in use: {}", tags.len());
    // And the probe's start (the low bits) is not fixed by the partition either.
    assert!(
        starts.len() > 900,
        "start positions in use: {}",
        starts.len()
    );
}

#[test]
fn lazy_and_active_expiry_and_compaction() {
    let mut s = Store::new(0, 0);
    for i in 0..20_000u32 {
        put(
            &mut s,
            &i.to_be_bytes(),
            Value::Bucket(State::Gcra { tat: 100 }),
            100,
            0,
        )
        .unwrap();
    }
    put(&mut s, b"forever", Value::Int(1), 0, 0).unwrap();
    assert!(s.get(&7u32.to_be_bytes(), 100).is_none());
    assert_eq!(s.sweep(100, Store::partitions()), 20_000);
    assert_eq!(s.len(), 1);
    assert!(s.get(b"forever", 1 << 60).is_some());
    // The walk that expired them keeps the partitions' room, for keys to come...
    let arena: usize = s.partitions.iter().map(|p| p.arena.capacity()).sum();
    assert!(arena >= 20_000 * 20, "room not kept: {arena}");
    // ...and the next walk, which finds nothing expired, gives it back.
    assert_eq!(s.sweep(100, Store::partitions()), 0);
    let arena: usize = s.partitions.iter().map(|p| p.arena.capacity()).sum();
    assert!(arena < 1024, "arenas not released: {arena}");
    let index: usize = s.partitions.iter().map(|p| p.index.capacity()).sum();
    assert!(index < 1024, "indexes not released: {index}");
    assert!(s.get(b"forever", 1 << 60).is_some());
}

#[test]
fn updates_that_change_size_survive_compaction() {
    let mut s = Store::new(0, 0);
    for round in 0..8u64 {
        for i in 0..20_000u32 {
            let v = if round % 2 == 0 {
                Value::Int(round as i64)
            } else {
                Value::Bucket(State::Fixed {
                    start: round,
                    count: u64::from(i),
                })
            };
            put(&mut s, &i.to_le_bytes(), v, 1_000_000, 0).unwrap();
        }
        s.sweep(0, Store::partitions());
    }
    for i in 0..20_000u32 {
        let e = s.get(&i.to_le_bytes(), 0).unwrap();
        assert_eq!(
            e.value,
            Value::Bucket(State::Fixed {
                start: 7,
                count: u64::from(i)
            })
        );
    }
    // Live records are 30 bytes each; without compaction eight rounds would leave ~7x that.
    let arena: usize = s.partitions.iter().map(|p| p.arena.len()).sum();
    assert!(arena < 20_000 * 30 * 3, "dead space not reclaimed: {arena}");
}

#[test]
fn sweep_walks_only_partitions_with_something_due() {
    let mut s = Store::new(0, 0);
    for i in 0..10_000u32 {
        put(&mut s, &i.to_be_bytes(), Value::Int(1), 0, 0).unwrap();
    }
    s.sweep(1_000, Store::partitions());
    assert_eq!(
        s.usage.sweep_walks, 0,
        "keys without expiry are never walked"
    );
    for i in 0..10_000u32 {
        let exp = if i == 7 { 500 } else { 1_000_000_000_000 };
        put(&mut s, &(i + 100_000).to_be_bytes(), Value::Int(1), exp, 0).unwrap();
    }
    s.sweep(100, Store::partitions());
    assert_eq!(s.usage.sweep_walks, 0, "nothing is due yet");
    assert_eq!(s.sweep(600, Store::partitions()), 1);
    assert_eq!(
        s.usage.sweep_walks, 1,
        "only the partition holding the due key"
    );
    // One key trickling out rests its partition; a full expiry is swept at once.
    assert_eq!(s.sweep(1_000_000_000_001, Store::partitions()), 9_999);
    assert_eq!(s.len(), 10_000);
}

/// `n` holders with tokens and deadlines from 1, packed into `buf`.
fn semaphore(n: u64, buf: &mut Vec<u8>) -> Value<'_> {
    let holders: Vec<Holder> = (1..=n)
        .map(|i| Holder {
            token: i,
            deadline: 1_000 + i,
        })
        .collect();
    Value::Semaphore(Semaphore {
        next_token: n + 1,
        holders: Holders::pack(&holders, buf),
    })
}

#[test]
fn a_semaphore_moving_within_its_room_is_rewritten_in_place() {
    let mut s = Store::new(0, 0);
    let mut buf = Vec::new();
    let mut arena_after = Vec::new();
    // Up to 16 holders and back down to 5: 4 → 8 → 16 on the way up, and the room of 16
    // is kept on the way down while more than a quarter of it is used.
    let counts: Vec<u64> = (1..=16).chain((5..16).rev()).collect();
    for &n in &counts {
        put(&mut s, b"sem", semaphore(n, &mut buf), 2_000, 0).unwrap();
        let e = s.get(b"sem", 0).unwrap();
        assert_eq!(e.value, semaphore(n, &mut Vec::new()), "{n} holders");
        assert_eq!(e.expires_at, 2_000);
        arena_after.push(s.partitions.iter().map(|p| p.arena.len()).sum::<usize>());
    }
    let grew = arena_after.windows(2).filter(|w| w[1] != w[0]).count();
    assert_eq!(grew, 2, "only the growth to 8 and to 16 appends a record");
    // The bytes counted are the record's, room included: 16 holders of 16 bytes and more.
    assert!(s.usage.bytes > 16 * 16, "{}", s.usage.bytes);
    // Down to 4 of 16: the record shrinks to a room of 4.
    put(&mut s, b"sem", semaphore(4, &mut buf), 2_000, 0).unwrap();
    assert!(s.usage.bytes < 8 * 16, "{}", s.usage.bytes);
    assert_eq!(
        s.get(b"sem", 0).map(|e| e.value),
        Some(semaphore(4, &mut buf))
    );
}

#[test]
fn semaphores_survive_compaction() {
    let mut s = Store::new(0, 0);
    let mut buf = Vec::new();
    for round in 1..=6u64 {
        for i in 0..2_000u32 {
            let n = round * 3;
            put(&mut s, &i.to_le_bytes(), semaphore(n, &mut buf), 10_000, 0).unwrap();
        }
        s.sweep(0, Store::partitions());
    }
    for i in 0..2_000u32 {
        let e = s.get(&i.to_le_bytes(), 0).unwrap();
        assert_eq!(e.value, semaphore(18, &mut buf));
    }
    assert_eq!(s.sweep(10_000, Store::partitions()), 2_000);
    assert_eq!(s.usage.bytes, 0);
}

#[test]
fn sweep_samples_the_average_ttl() {
    let mut s = Store::new(0, 0);
    for i in 0..200u32 {
        put(&mut s, &i.to_be_bytes(), Value::Int(1), 7_000_000_000, 0).unwrap();
    }
    put(&mut s, b"forever", Value::Int(1), 0, 0).unwrap();
    s.sweep(2_000_000_000, Store::partitions());
    assert_eq!(s.usage.avg_ttl_ms, 5_000);
}
