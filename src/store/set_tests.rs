//! The set's two encodings against a `BTreeSet` and an insertion-ordered list, under random
//! operations.

use super::*;
use std::collections::BTreeSet;

/// A fixed-seed xorshift generator: the same operations on every run.
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

    /// Mostly integers of every width, some strings that look like integers but are not.
    fn member(&mut self, strings: bool) -> Vec<u8> {
        let v = match self.below(4) {
            0 => self.below(300) as i64 - 150,
            1 => self.below(200_000) as i64 - 100_000,
            2 => (self.below(2000) as i64 - 1000) * 10_000_000_000,
            _ => [i64::MIN, i64::MAX, 0, -1][self.below(4) as usize],
        };
        if strings && self.below(6) == 0 {
            return match self.below(4) {
                0 => format!("+{}", v.unsigned_abs()).into_bytes(),
                1 => format!("0{v}").into_bytes(),
                2 => b"-0".to_vec(),
                _ => format!("m{}", self.below(700)).into_bytes(),
            };
        }
        v.to_string().into_bytes()
    }
}

fn check_mem(s: &MemberSet) {
    let copy = s.clone();
    assert_eq!(copy.mem(), s.mem());
    assert_eq!(&copy, s);
    if let Repr::Table(t) = &s.repr {
        assert!((t.live + t.tombs) * 8 <= t.slots.len() * 7);
        assert!(t.slots.len().is_power_of_two());
        let mut n = 0;
        t.for_each(|m| {
            assert!(t.find(m, hash_bytes(m)).is_some());
            n += 1;
        });
        assert_eq!(n, t.live);
    }
}

#[test]
fn integers_stay_an_intset_in_ascending_order_up_to_512() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for _ in 0..30 {
        let mut s = MemberSet::new();
        let mut want = BTreeSet::new();
        for _ in 0..700 {
            let m = rng.member(false);
            let v: i64 = String::from_utf8_lossy(&m).parse().unwrap_or(0);
            if rng.below(3) == 0 {
                assert_eq!(s.remove(&m), want.remove(&v));
            } else {
                let was_intset = s.encoding() == "intset";
                assert_eq!(s.add(&m, MAX_INTSET), Ok(want.insert(v)));
                if was_intset && want.len() <= MAX_INTSET {
                    assert_eq!(s.encoding(), "intset");
                }
            }
            assert_eq!(s.len(), want.len());
            assert!(s.contains(&m) == want.contains(&v));
            if s.encoding() == "intset" {
                let got: Vec<Vec<u8>> = s.to_owned_members();
                let sorted: Vec<Vec<u8>> =
                    want.iter().map(|v| v.to_string().into_bytes()).collect();
                assert_eq!(got, sorted);
            }
            check_mem(&s);
        }
    }
}

#[test]
fn the_513th_integer_makes_a_hashtable_and_it_stays_one() {
    let mut s = MemberSet::new();
    for i in 0..512 {
        assert_eq!(s.add(i.to_string().as_bytes(), MAX_INTSET), Ok(true));
    }
    assert_eq!(s.encoding(), "intset");
    assert_eq!(s.add(b"511", MAX_INTSET), Ok(false));
    assert_eq!(s.encoding(), "intset");
    assert_eq!(s.add(b"-7", MAX_INTSET), Ok(true));
    assert_eq!(s.encoding(), "hashtable");
    assert!(s.remove(b"-7") && s.remove(b"0"));
    assert_eq!(s.encoding(), "hashtable");
    let mut t = MemberSet::new();
    t.add(b"5", MAX_INTSET).ok();
    t.add(b"05", MAX_INTSET).ok();
    assert_eq!(t.encoding(), "hashtable");
    assert_eq!(t.to_owned_members(), vec![b"5".to_vec(), b"05".to_vec()]);
}

#[test]
fn random_strings_match_an_ordered_oracle() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for round in 0..10 {
        let mut s = MemberSet::new();
        // Members in the order they were first added, as a hashtable lists them.
        let mut want: Vec<Vec<u8>> = Vec::new();
        for _ in 0..3000 {
            let m = rng.member(true);
            if rng.below(3) == 0 {
                let had = want.iter().position(|x| *x == m);
                assert_eq!(s.remove(&m), had.is_some());
                if let Some(p) = had {
                    want.remove(p);
                }
            } else {
                let new = !want.contains(&m);
                let was_intset = s.encoding() == "intset";
                assert_eq!(s.add(&m, MAX_INTSET), Ok(new));
                if new {
                    want.push(m.clone());
                }
                if was_intset && s.encoding() == "hashtable" {
                    // The intset's members come over in ascending order, then a new string.
                    let key = |m: &Vec<u8>| as_int(m).map_or((1, 0), |v| (0, v));
                    want.sort_by_key(key);
                }
            }
            assert_eq!(s.len(), want.len());
            if s.encoding() == "hashtable" {
                assert_eq!(s.to_owned_members(), want, "round {round}");
            } else {
                // Still an intset: every member so far was an integer.
                let mut sorted: Vec<i64> = want
                    .iter()
                    .map(|m| String::from_utf8_lossy(m).parse().unwrap_or(0))
                    .collect();
                sorted.sort_unstable();
                let got: Vec<i64> = s
                    .to_owned_members()
                    .iter()
                    .map(|m| String::from_utf8_lossy(m).parse().unwrap_or(0))
                    .collect();
                assert_eq!(got, sorted);
            }
            check_mem(&s);
        }
        let back = MemberSet::from_owned_members(&s.to_owned_members());
        assert_eq!(back.to_owned_members(), s.to_owned_members());
        for m in want {
            assert!(s.remove(&m));
        }
        assert!(s.is_empty());
        assert_eq!(s.mem(), 0);
    }
}

#[test]
fn members_cost_little_more_than_their_bytes() {
    for n in [100usize, 10_000] {
        let mut s = MemberSet::new();
        for i in 0..n {
            s.add(format!("member-{i:013}").as_bytes(), MAX_INTSET).ok();
        }
        assert_eq!(s.encoding(), "hashtable");
        let per = s.mem() as f64 / n as f64;
        eprintln!(
            "hashtable of {n} 20-byte members: {} bytes, {per:.2} a member",
            s.mem()
        );
        assert!(per < 32.0, "{n} members: {per:.1} bytes each");
        let mut ints = MemberSet::new();
        for i in 0..n.min(MAX_INTSET) {
            ints.add(i.to_string().as_bytes(), MAX_INTSET).ok();
        }
        assert!(ints.mem() <= 2 * n.min(MAX_INTSET) * 9 / 8 + 16);
        eprintln!(
            "intset of {} small integers: {} bytes",
            n.min(MAX_INTSET),
            ints.mem()
        );
    }
}
