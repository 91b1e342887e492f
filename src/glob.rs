//! Redis-style glob patterns (`*`, `?`, `[abc]`, `[^a-z]`, `\x`) for KEYS, SCAN MATCH,
//! CONFIG GET and COMMAND LIST FILTERBY PATTERN.
//!
//! Edge cases follow Redis's `stringmatchlen`: a class left open at the end of the pattern
//! ends there (`[ab` matches `a`), a range may end in `]` (`[a-]`), `\` escapes inside a class
//! too, and a `\` at the very end of the pattern is a literal backslash.

/// True if `text` matches `pattern`, case-sensitively (KEYS, SCAN).
pub(crate) fn matches(pattern: &[u8], text: &[u8]) -> bool {
    matches_with(pattern, text, false)
}

/// True if `text` matches `pattern`, ignoring ASCII case (CONFIG GET, COMMAND LIST).
pub(crate) fn matches_nocase(pattern: &[u8], text: &[u8]) -> bool {
    matches_with(pattern, text, true)
}

/// Iterative with single-star backtracking, so a hostile pattern costs at most
/// O(pattern * text): every other element consumes exactly one byte of text, so retrying
/// only from the last star finds a match whenever one exists.
fn matches_with(pattern: &[u8], text: &[u8], nocase: bool) -> bool {
    let fold = |b: u8| if nocase { b.to_ascii_lowercase() } else { b };
    let (mut p, mut t) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() {
            let c = fold(text[t]);
            let step = match pattern[p] {
                b'*' => {
                    star = Some((p, t));
                    p += 1;
                    continue;
                }
                b'?' => Some(p + 1),
                b'[' => {
                    let (hit, next) = class(pattern, p, c, nocase);
                    hit.then_some(next)
                }
                b'\\' if p + 1 < pattern.len() => (fold(pattern[p + 1]) == c).then_some(p + 2),
                lit => (fold(lit) == c).then_some(p + 1),
            };
            if let Some(next) = step {
                p = next;
                t += 1;
                continue;
            }
        }
        match star {
            Some((sp, st)) => {
                p = sp + 1;
                t = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Matches `c` (already case-folded when `nocase`) against the class that starts at
/// `pattern[start] == '['`; returns whether it matched and the index after the class.
fn class(pattern: &[u8], start: usize, c: u8, nocase: bool) -> (bool, usize) {
    let fold = |b: u8| if nocase { b.to_ascii_lowercase() } else { b };
    let mut i = start + 1;
    let negate = pattern.get(i) == Some(&b'^');
    if negate {
        i += 1;
    }
    let mut hit = false;
    loop {
        let Some(&b) = pattern.get(i) else {
            // Open at the end of the pattern: the class ends here.
            return (hit != negate, pattern.len());
        };
        if b == b'\\' && i + 1 < pattern.len() {
            hit |= fold(pattern[i + 1]) == c;
            i += 2;
        } else if b == b']' {
            return (hit != negate, i + 1);
        } else if i + 2 < pattern.len() && pattern[i + 1] == b'-' {
            let (a, z) = (fold(b), fold(pattern[i + 2]));
            let (lo, hi) = (a.min(z), a.max(z));
            hit |= (lo..=hi).contains(&c);
            i += 3;
        } else {
            hit |= fold(b) == c;
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{matches, matches_nocase};

    #[test]
    fn patterns() {
        assert!(matches(b"*", b"anything"));
        assert!(matches(b"h?llo", b"hello"));
        assert!(matches(b"h*llo", b"heeeello"));
        assert!(matches(b"h[ae]llo", b"hallo"));
        assert!(!matches(b"h[^e]llo", b"hello"));
        assert!(matches(b"h[a-b]llo", b"hbllo"));
        assert!(matches(b"user:*:min", b"user:42:min"));
        assert!(!matches(b"user:*:min", b"user:42:hour"));
        assert!(matches(b"a\\*b", b"a*b"));
        assert!(!matches(b"abc", b"ab"));
        assert!(matches(b"", b""));
    }

    #[test]
    fn edge_cases_as_redis_has_them() {
        // An unterminated class ends with the pattern.
        assert!(matches(b"[ab", b"a"));
        assert!(!matches(b"[ab", b"c"));
        // A range may end in ']' and the class then goes on.
        assert!(matches(b"[a-]x]", b"_"));
        assert!(matches(b"[z-a]", b"m"));
        // Escapes inside a class; a trailing backslash is literal.
        assert!(matches(b"[\\]]", b"]"));
        assert!(matches(b"a\\", b"a\\"));
        assert!(!matches(b"[]", b"a"));
        assert!(matches(b"[^]", b"a"));
    }

    #[test]
    fn case_folding() {
        assert!(matches_nocase(b"MAX*", b"maxclients"));
        assert!(matches_nocase(b"[A-C]x", b"bX"));
        assert!(!matches(b"MAX*", b"maxclients"));
    }
}
