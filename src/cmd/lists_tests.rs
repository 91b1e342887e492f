//! List commands on a store: ranges as Redis clamps them, keys deleted when emptied, and
//! refusals that change nothing.

use super::*;

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn run(store: &mut Store, op: ListOp) -> Reply {
    execute(store, b"l", &op, 0)
}

fn rpush(items: &[&str]) -> ListOp {
    ListOp::Push {
        head: false,
        existing: false,
        items: items.iter().map(|s| b(s)).collect(),
    }
}

fn bulks(items: &[&str]) -> Reply {
    Reply::Array(items.iter().map(|s| Reply::Bulk(b(s))).collect())
}

#[test]
fn ranges_clamp_as_redis_clamps_them() {
    assert_eq!(span(5, 0, -1), Some((0, 4)));
    assert_eq!(span(5, -100, 100), Some((0, 4)));
    assert_eq!(span(5, 3, 1), None);
    assert_eq!(span(5, 5, 10), None);
    assert_eq!(span(5, i64::MIN, i64::MAX), Some((0, 4)));
    assert_eq!(span(0, 0, -1), None);
    assert_eq!(position(3, -1), Some(2));
    assert_eq!(position(3, -4), None);
    assert_eq!(position(3, 3), None);
    assert_eq!(position(3, i64::MIN), None);
}

#[test]
fn a_list_emptied_by_any_command_is_no_key() {
    let mut s = Store::new(0, 0);
    for op in [
        ListOp::Pop {
            head: true,
            count: None,
        },
        ListOp::Pop {
            head: false,
            count: Some(5),
        },
        ListOp::Trim { start: 5, stop: 1 },
        ListOp::Rem {
            count: 0,
            value: b("a"),
        },
    ] {
        assert_eq!(run(&mut s, rpush(&["a"])), Reply::Int(1));
        run(&mut s, op);
        assert_eq!(s.len(), 0);
        assert_eq!(s.usage.bytes, 0);
    }
}

#[test]
fn pops_lrem_and_linsert_answer_as_redis() {
    let mut s = Store::new(0, 0);
    run(&mut s, rpush(&["a", "b", "a", "c", "a"]));
    assert_eq!(
        run(
            &mut s,
            ListOp::Rem {
                count: -2,
                value: b("a")
            }
        ),
        Reply::Int(2)
    );
    assert_eq!(
        run(&mut s, ListOp::Range { start: 0, stop: -1 }),
        bulks(&["a", "b", "c"])
    );
    let insert = |after, pivot| ListOp::Insert {
        after,
        pivot: b(pivot),
        value: b("x"),
    };
    assert_eq!(run(&mut s, insert(true, "b")), Reply::Int(4));
    assert_eq!(run(&mut s, insert(false, "zz")), Reply::Int(-1));
    assert_eq!(
        run(
            &mut s,
            ListOp::Pop {
                head: false,
                count: Some(3)
            }
        ),
        bulks(&["c", "x", "b"])
    );
    assert_eq!(
        execute(
            &mut s,
            b"missing",
            &ListOp::Pop {
                head: false,
                count: Some(3)
            },
            0
        ),
        Reply::NilArray
    );
}

#[test]
fn a_full_store_refuses_growth_but_not_shrinking() {
    let mut s = Store::new(1, 0);
    assert_eq!(run(&mut s, rpush(&["a", "b"])), Reply::Int(2));
    assert_eq!(
        execute(&mut s, b"other", &rpush(&["a"]), 0),
        Reply::err(OOM)
    );
    assert_eq!(
        run(
            &mut s,
            ListOp::Pop {
                head: true,
                count: None
            }
        ),
        Reply::Bulk(b("a"))
    );
}
