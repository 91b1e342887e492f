//! Redis-style glob patterns (`*`, `?`, `[abc]`, `[^a-z]`, `\x`) for KEYS.

/// True if `text` matches `pattern`. Iterative with single-star backtracking, so a hostile
/// pattern costs at most O(pattern * text).
pub fn matches(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    star = Some((p, t));
                    p += 1;
                    continue;
                }
                b'?' => {
                    p += 1;
                    t += 1;
                    continue;
                }
                b'[' => {
                    if let Some((ok, next)) = class(pattern, p, text[t])
                        && ok
                    {
                        p = next;
                        t += 1;
                        continue;
                    }
                }
                b'\\' if p + 1 < pattern.len() => {
                    if pattern[p + 1] == text[t] {
                        p += 2;
                        t += 1;
                        continue;
                    }
                }
                c => {
                    if c == text[t] {
                        p += 1;
                        t += 1;
                        continue;
                    }
                }
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

/// Matches `c` against the class starting at `pattern[start] == '['`; returns whether it
/// matched and the index after the class.
fn class(pattern: &[u8], start: usize, c: u8) -> Option<(bool, usize)> {
    let mut i = start + 1;
    let negate = pattern.get(i) == Some(&b'^');
    if negate {
        i += 1;
    }
    let mut hit = false;
    loop {
        let &b = pattern.get(i)?;
        if b == b']' {
            return Some((hit != negate, i + 1));
        }
        if b == b'\\' {
            let &e = pattern.get(i + 1)?;
            hit |= e == c;
            i += 2;
        } else if pattern.get(i + 1) == Some(&b'-')
            && pattern.get(i + 2).is_some_and(|&x| x != b']')
        {
            let (lo, hi) = (b.min(pattern[i + 2]), b.max(pattern[i + 2]));
            hit |= (lo..=hi).contains(&c);
            i += 3;
        } else {
            hit |= b == c;
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::matches;

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
}
