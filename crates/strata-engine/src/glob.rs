//! Redis-style glob matching (`*`, `?`, `[a-z]`, `[^x]`, `\` escapes), as pins, `KEYS`,
//! `SCAN MATCH` and `CONFIG GET` use it.

/// Whether `s` matches `pattern`.
pub fn glob_match(pattern: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0usize, 0usize);
    // Backtracking point for the last '*': (pattern index after it, string index).
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    star = Some((p + 1, i));
                    p += 1;
                    continue;
                }
                b'?' => {
                    p += 1;
                    i += 1;
                    continue;
                }
                b'[' => {
                    if let Some((matched, next)) = class_match(pattern, p, s[i]) {
                        if matched {
                            p = next;
                            i += 1;
                            continue;
                        }
                    }
                }
                b'\\' if p + 1 < pattern.len() => {
                    if pattern[p + 1] == s[i] {
                        p += 2;
                        i += 1;
                        continue;
                    }
                }
                c => {
                    if c == s[i] {
                        p += 1;
                        i += 1;
                        continue;
                    }
                }
            }
        }
        match star {
            Some((sp, si)) => {
                p = sp;
                i = si + 1;
                star = Some((sp, si + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Matches `c` against the class starting at `pattern[p] == '['`; returns whether it
/// matched and the index after the class.
fn class_match(pattern: &[u8], p: usize, c: u8) -> Option<(bool, usize)> {
    let mut j = p + 1;
    let negate = pattern.get(j) == Some(&b'^');
    if negate {
        j += 1;
    }
    let mut matched = false;
    while j < pattern.len() && pattern[j] != b']' {
        if pattern[j] == b'\\' && j + 1 < pattern.len() {
            matched |= pattern[j + 1] == c;
            j += 2;
        } else if j + 2 < pattern.len() && pattern[j + 1] == b'-' && pattern[j + 2] != b']' {
            let (a, b) = (
                pattern[j].min(pattern[j + 2]),
                pattern[j].max(pattern[j + 2]),
            );
            matched |= (a..=b).contains(&c);
            j += 3;
        } else {
            matched |= pattern[j] == c;
            j += 1;
        }
    }
    if j >= pattern.len() {
        return None;
    }
    Some((matched != negate, j + 1))
}

/// The literal prefix of a pattern: every key it matches starts with it.
pub fn literal_prefix(pattern: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < pattern.len() {
        match pattern[i] {
            b'*' | b'?' | b'[' => break,
            b'\\' if i + 1 < pattern.len() => {
                out.push(pattern[i + 1]);
                i += 2;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match(b"*", b""));
        assert!(glob_match(b"user:*", b"user:42"));
        assert!(!glob_match(b"user:*", b"use"));
        assert!(glob_match(b"h?llo", b"hello"));
        assert!(glob_match(b"h[ae]llo", b"hallo"));
        assert!(!glob_match(b"h[^e]llo", b"hello"));
        assert!(glob_match(b"h[a-c]llo", b"hbllo"));
        assert!(glob_match(b"a*b*c", b"axxbyyc"));
        assert!(!glob_match(b"a*b*c", b"axxbyy"));
        assert!(glob_match(b"a\\*", b"a*"));
        assert!(!glob_match(b"a\\*", b"ab"));
        assert_eq!(literal_prefix(b"user:\\*x*"), b"user:*x");
    }
}
