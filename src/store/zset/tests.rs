use super::*;

/// The oracle: a plain vector kept sorted by (score, member).
#[derive(Default)]
struct Oracle(Vec<(f64, Vec<u8>)>);

impl Oracle {
    /// As Redis: a score equal to the old one (0 and -0 are equal) changes nothing.
    fn set(&mut self, m: &[u8], s: f64) -> Option<f64> {
        if let Some((old, _)) = self.0.iter().find(|(_, om)| om == m)
            && *old == s
        {
            return Some(*old);
        }
        let old = self.remove(m);
        let at = self
            .0
            .partition_point(|(os, om)| cmp_key((*os, om), (s, m)) == Ordering::Less);
        self.0.insert(at, (s, m.to_vec()));
        old
    }

    fn remove(&mut self, m: &[u8]) -> Option<f64> {
        let i = self.0.iter().position(|(_, om)| om == m)?;
        Some(self.0.remove(i).0)
    }

    fn pairs(&self) -> Vec<(Vec<u8>, u64)> {
        self.0
            .iter()
            .map(|(s, m)| (m.clone(), s.to_bits()))
            .collect()
    }
}

/// Pairs with -0 read as 0: the packed form keeps -0 as 0, as a listpack does, and the oracle
/// does not know which form held a member when it was set.
fn signless(pairs: Vec<(Vec<u8>, u64)>) -> Vec<(Vec<u8>, u64)> {
    pairs
        .into_iter()
        .map(|(m, s)| (m, (f64::from_bits(s) + 0.0).to_bits()))
        .collect()
}

/// A deterministic generator (xorshift), so a failure repeats.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn member(rng: &mut Rng, space: u64, long: bool) -> Vec<u8> {
    let n = rng.below(space);
    let mut m = format!("m{n}").into_bytes();
    if long && n.is_multiple_of(7) {
        m.extend(std::iter::repeat_n(b'x', 70));
    }
    m
}

fn score(rng: &mut Rng) -> f64 {
    match rng.below(6) {
        0 => f64::INFINITY,
        1 => f64::NEG_INFINITY,
        2 => (rng.below(10) as f64) / 4.0 - 1.0,
        3 => -0.0,
        _ => rng.below(20) as f64,
    }
}

fn entries(z: &ZSet, from: usize, to: usize) -> Vec<(Vec<u8>, u64)> {
    let mut out = Vec::new();
    z.each(from, to, |(m, s)| out.push((m.to_vec(), s.to_bits())));
    out
}

/// Random operations on a set and on the oracle; after each, the two must agree in full.
fn run(seed: u64, ops: usize, space: u64, long: bool) -> ZSet {
    let mut rng = Rng(seed);
    let mut z = ZSet::new();
    let mut o = Oracle::default();
    for step in 0..ops {
        match rng.below(10) {
            0..=4 => {
                let (m, s) = (member(&mut rng, space, long), score(&mut rng));
                let was_packed = z.encoding() == "listpack";
                let (old, stored) = z.set(&m, s);
                assert!(stored);
                assert_eq!(old.map(|v| v + 0.0), o.set(&m, s).map(|v| v + 0.0));
                if was_packed && z.encoding() == "skiplist" {
                    assert!(
                        o.0.len() > MAX_PACKED_ENTRIES || m.len() > MAX_PACKED_VALUE,
                        "converted early at step {step}"
                    );
                }
            }
            5 | 6 => {
                let m = member(&mut rng, space, long);
                assert_eq!(z.remove(&m).map(|v| v + 0.0), o.remove(&m).map(|v| v + 0.0));
            }
            7 => {
                let from = rng.below(o.0.len() as u64 + 2) as usize;
                let to = from + rng.below(4) as usize;
                let removed = z.remove_range(from, to);
                let end = to.min(o.0.len());
                let want = end.saturating_sub(from);
                if from < end {
                    o.0.drain(from..end);
                }
                assert_eq!(removed, want);
            }
            8 => {
                let m = member(&mut rng, space, long);
                let want = o.0.iter().position(|(_, om)| *om == m);
                assert_eq!(z.rank(&m), want);
                assert_eq!(z.score(&m).map(|v| v + 0.0), want.map(|i| o.0[i].0 + 0.0));
            }
            _ => {
                let bound = score(&mut rng);
                let want = o.0.iter().filter(|(s, _)| *s < bound).count();
                assert_eq!(z.partition_point(|(_, s)| s < bound), want);
                let from = rng.below(o.0.len() as u64 + 1) as usize;
                let to = from + rng.below(10) as usize;
                let want: Vec<_> = o.pairs().into_iter().skip(from).take(to - from).collect();
                assert_eq!(signless(entries(&z, from, to)), signless(want));
            }
        }
        assert_eq!(z.len(), o.0.len(), "step {step}");
        assert_eq!(
            signless(z.to_owned_pairs()),
            signless(o.pairs()),
            "step {step}"
        );
    }
    z
}

#[test]
fn small_sets_stay_packed_and_agree_with_the_oracle() {
    for seed in 1..20 {
        let z = run(seed, 400, 60, false);
        assert_eq!(z.encoding(), "listpack");
    }
}

#[test]
fn large_sets_move_to_the_index_and_agree_with_the_oracle() {
    for seed in 1..6 {
        let z = run(seed * 7919, 3000, 400, false);
        assert_eq!(z.encoding(), "skiplist");
    }
}

#[test]
fn a_long_member_moves_a_set_to_the_index() {
    for seed in 1..10 {
        run(seed * 31, 300, 40, true);
    }
    let mut z = ZSet::new();
    z.set(&[b'a'; 64], 1.0);
    assert_eq!(z.encoding(), "listpack");
    z.set(&[b'b'; 65], 1.0);
    assert_eq!(z.encoding(), "skiplist");
}

#[test]
fn the_129th_member_converts_and_removal_never_converts_back() {
    let mut z = ZSet::new();
    for i in 0..128 {
        z.set(format!("{i:04}").as_bytes(), f64::from(i));
    }
    assert_eq!(z.encoding(), "listpack");
    // Updating an existing member does not convert.
    z.set(b"0000", 500.0);
    assert_eq!(z.encoding(), "listpack");
    z.set(b"new", 1.0);
    assert_eq!(z.encoding(), "skiplist");
    z.remove_range(0, 120);
    assert_eq!(z.len(), 9);
    assert_eq!(z.encoding(), "skiplist");
    // A snapshot of it loads packed again, equal to it.
    let back = ZSet::from_owned_pairs(&z.to_owned_pairs());
    assert_eq!(back.encoding(), "listpack");
    assert_eq!(back, z);
}

#[test]
fn snapshots_round_trip_in_both_encodings() {
    for n in [0, 5, 128, 129, 1000] {
        let mut z = ZSet::new();
        for i in 0..n {
            z.set(format!("m{i}").as_bytes(), f64::from(i % 17) - 3.5);
        }
        let pairs = z.to_owned_pairs();
        let back = ZSet::from_owned_pairs(&pairs);
        assert_eq!(back.to_owned_pairs(), pairs);
        assert_eq!(back.encoding(), z.encoding());
        assert_eq!(back, z);
    }
}

#[test]
fn scores_keep_their_bits_in_the_packed_form() {
    let mut z = ZSet::new();
    let scores = [
        0.0,
        1.0,
        -1.0,
        0.1,
        1e300,
        -1e-300,
        f64::INFINITY,
        f64::NEG_INFINITY,
        9_007_199_254_740_991.0,
        9_007_199_254_740_992.0,
        -9_007_199_254_740_993.0,
        1_700_000_000_123.0,
        f64::MIN_POSITIVE / 4.0,
    ];
    for (i, s) in scores.iter().enumerate() {
        z.set(format!("m{i}").as_bytes(), *s);
    }
    for (i, s) in scores.iter().enumerate() {
        let got = z.score(format!("m{i}").as_bytes()).map(f64::to_bits);
        assert_eq!(got, Some(s.to_bits()), "{s}");
    }
    // -0 is kept as 0 while packed, as a listpack keeps it, and as -0 in the index.
    z.set(b"neg", -0.0);
    assert_eq!(z.score(b"neg").map(f64::to_bits), Some(0));
    let mut z = ZSet::from_owned_pairs(&[(vec![b'x'; 100], 0)]);
    z.set(b"neg", -0.0);
    assert_eq!(z.score(b"neg").map(f64::to_bits), Some((-0.0f64).to_bits()));
}

#[test]
fn memory_is_counted_incrementally_and_below_redis() {
    // Redis 7.0 (MEMORY USAGE, 20-byte members): a listpack of 100 members with small
    // integer scores takes 2 560 bytes; a skiplist of 10 000 about 1 289 000 bytes.
    let member = |i: u32| format!("m{i:019}").into_bytes();
    let mut z = ZSet::new();
    for i in 0..100 {
        z.set(&member(i), f64::from(i));
    }
    assert_eq!(z.encoding(), "listpack");
    assert!(z.mem() <= 2560, "{}", z.mem());
    let mut z = ZSet::new();
    for i in 0..10_000 {
        z.set(&member(i), f64::from(i));
    }
    assert!(z.mem() <= 1_289_000, "{}", z.mem());
    // Emptied, the index gives its members' bytes back.
    let before = z.mem();
    z.remove_range(0, 10_000);
    assert!(z.is_empty());
    assert!(z.mem() < before - 10_000 * 24);
}

#[test]
fn the_same_operations_build_the_same_structure() {
    let a = run(99, 2000, 300, true);
    let b = run(99, 2000, 300, true);
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
}

#[test]
fn alloc_sizes_follow_jemalloc_classes() {
    assert_eq!(alloc_size(0), 0);
    assert_eq!(alloc_size(1), 8);
    assert_eq!(alloc_size(20), 32);
    assert_eq!(alloc_size(128), 128);
    assert_eq!(alloc_size(129), 160);
    assert_eq!(alloc_size(2200), 2560);
    assert_eq!(alloc_size(4096), 4096);
    assert_eq!(alloc_size(4097), 5120);
}
