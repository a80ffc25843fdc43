//! An online Markov model of key-to-key transitions, for speculative prefetch.
//!
//! Keys are generalised to their *shape*: every run of ASCII digits becomes `#`
//! (`session:42:chunk:0007` → `session:#:chunk:#`). A transition from key `a` to key `b`
//! seen in one client's stream is recorded as a *rule* of `a`'s shape: `b`'s shape plus, for
//! every number in `b`, either its offset from the number in the same position of `a` (when
//! both shapes have as many numbers) or its literal value. So "the next chunk of the same
//! session" is one rule, `+1` on the last number, learned from any session and applied to
//! every other. Rule weights decay as new transitions arrive, so the model follows a
//! changing workload. Every table is bounded.
//!
//! ```
//! use strata_policy::MarkovModel;
//! let mut m = MarkovModel::default();
//! for i in 0..20 {
//!     m.observe(format!("s:1:{i:04}").as_bytes(), format!("s:1:{:04}", i + 1).as_bytes());
//! }
//! assert_eq!(m.predict(b"s:9:0041", 3, 0.5), vec![b"s:9:0042".to_vec(), b"s:9:0043".to_vec(), b"s:9:0044".to_vec()]);
//! ```

use std::collections::HashMap;

/// Most distinct source shapes kept.
const SHAPES_MAX: usize = 4096;
/// Most rules kept per source shape.
const RULES_PER_SHAPE_MAX: usize = 8;
/// Each observation multiplies the other rules' weights of its shape by this.
const DECAY: f64 = 0.98;
/// Longest key the model looks at.
const KEY_BYTES_MAX: usize = 512;

/// One number of a predicted key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Field {
    /// The number at the same position of the source key, plus this.
    Offset(i64),
    /// This literal value.
    Literal(u64),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Rule {
    to_shape: Vec<u8>,
    /// One per number of `to_shape`, with its printed width (zero-padded when > digits).
    fields: Vec<(Field, u8)>,
}

#[derive(Default)]
struct Shape {
    rules: Vec<(Rule, f64)>,
    total: f64,
    /// Observations, for choosing which shape to forget when the table is full.
    seen: u64,
}

/// The online model; see the module documentation.
#[derive(Default)]
pub struct MarkovModel {
    shapes: HashMap<Vec<u8>, Shape>,
    observations: u64,
}

/// The numbers of a key: value and printed width.
type Numbers = Vec<(u64, u8)>;

/// `key`'s shape and its numbers.
fn split(key: &[u8]) -> Option<(Vec<u8>, Numbers)> {
    if key.len() > KEY_BYTES_MAX {
        return None;
    }
    let mut shape = Vec::with_capacity(key.len());
    let mut nums = Vec::new();
    let mut i = 0;
    while i < key.len() {
        if key[i].is_ascii_digit() {
            let start = i;
            while i < key.len() && key[i].is_ascii_digit() {
                i += 1;
            }
            let digits = &key[start..i];
            if digits.len() > 18 {
                return None; // not a counter; too long to do arithmetic on
            }
            let v = std::str::from_utf8(digits).ok()?.parse().ok()?;
            nums.push((v, digits.len() as u8));
            shape.push(b'#');
        } else {
            shape.push(key[i]);
            i += 1;
        }
    }
    Some((shape, nums))
}

fn rule_between(a: &[(u64, u8)], b_shape: Vec<u8>, b: &[(u64, u8)]) -> Rule {
    let same_arity = a.len() == b.len();
    let fields = b
        .iter()
        .enumerate()
        .map(|(i, &(v, w))| {
            let f = if same_arity {
                Field::Offset(v as i64 - a[i].0 as i64)
            } else {
                Field::Literal(v)
            };
            (f, w)
        })
        .collect();
    Rule {
        to_shape: b_shape,
        fields,
    }
}

fn apply(rule: &Rule, nums: &[(u64, u8)]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(rule.to_shape.len() + 8);
    // The n-th `#` of the target shape takes the n-th field (and, for an offset, the n-th
    // number of the source key).
    let mut fields = rule.fields.iter().enumerate();
    for &c in &rule.to_shape {
        if c != b'#' {
            out.push(c);
            continue;
        }
        let (n, (f, width)) = fields.next()?;
        let v = match f {
            Field::Offset(d) => {
                let src = nums.get(n)?.0 as i64;
                u64::try_from(src.checked_add(*d)?).ok()?
            }
            Field::Literal(v) => *v,
        };
        out.extend_from_slice(format!("{v:0width$}", width = *width as usize).as_bytes());
    }
    Some(out)
}

impl MarkovModel {
    /// Records that a client read `next` right after `prev`.
    pub fn observe(&mut self, prev: &[u8], next: &[u8]) {
        let (Some((from, a)), Some((to, b))) = (split(prev), split(next)) else {
            return;
        };
        let rule = rule_between(&a, to, &b);
        if !self.shapes.contains_key(&from) && self.shapes.len() >= SHAPES_MAX {
            // Forget the shape seen least often.
            if let Some(k) = self
                .shapes
                .iter()
                .min_by_key(|(_, s)| s.seen)
                .map(|(k, _)| k.clone())
            {
                self.shapes.remove(&k);
            }
        }
        self.observations += 1;
        let s = self.shapes.entry(from).or_default();
        s.seen += 1;
        for (_, w) in s.rules.iter_mut() {
            *w *= DECAY;
        }
        s.total = s.total * DECAY + 1.0;
        match s.rules.iter_mut().find(|(r, _)| *r == rule) {
            Some((_, w)) => *w += 1.0,
            None => {
                if s.rules.len() >= RULES_PER_SHAPE_MAX {
                    // Replace the weakest rule.
                    let weakest = s
                        .rules
                        .iter()
                        .enumerate()
                        .min_by(|x, y| x.1 .1.total_cmp(&y.1 .1))
                        .map(|(i, _)| i)
                        .unwrap_or(0);
                    s.rules.swap_remove(weakest);
                }
                s.rules.push((rule, 1.0));
            }
        }
    }

    /// The keys likely to be read after `key`: the most probable next key, then the one
    /// after it, up to `depth` steps, following only rules whose probability (share of the
    /// shape's recent transitions) is at least `min_probability`.
    pub fn predict(&self, key: &[u8], depth: usize, min_probability: f64) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut cur = key.to_vec();
        for _ in 0..depth {
            let Some((shape, nums)) = split(&cur) else {
                break;
            };
            let Some(s) = self.shapes.get(&shape) else {
                break;
            };
            let best = s
                .rules
                .iter()
                .max_by(|x, y| x.1.total_cmp(&y.1))
                .filter(|(_, w)| s.total > 0.0 && w / s.total >= min_probability);
            let Some(next) = best.and_then(|(r, _)| apply(r, &nums)) else {
                break;
            };
            if next == cur || out.contains(&next) || next == key {
                break;
            }
            out.push(next.clone());
            cur = next;
        }
        out
    }

    /// Transitions observed so far.
    pub fn observations(&self) -> u64 {
        self.observations
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_next_chunk_of_a_session_and_generalises_to_other_sessions() {
        let mut m = MarkovModel::default();
        for s in 0..5 {
            for i in 0..10 {
                m.observe(
                    format!("sess:{s}:chunk:{i:03}").as_bytes(),
                    format!("sess:{s}:chunk:{:03}", i + 1).as_bytes(),
                );
            }
        }
        assert_eq!(
            m.predict(b"sess:77:chunk:009", 2, 0.5),
            vec![b"sess:77:chunk:010".to_vec(), b"sess:77:chunk:011".to_vec()]
        );
    }

    #[test]
    fn cross_prefix_transitions_carry_the_shared_id() {
        let mut m = MarkovModel::default();
        for u in 0..10 {
            m.observe(
                format!("user:{u}:profile").as_bytes(),
                format!("feat:{u}:vector").as_bytes(),
            );
        }
        assert_eq!(
            m.predict(b"user:123:profile", 1, 0.5),
            vec![b"feat:123:vector".to_vec()]
        );
    }

    #[test]
    fn weak_or_unknown_transitions_predict_nothing() {
        let mut m = MarkovModel::default();
        assert!(m.predict(b"a:1", 3, 0.1).is_empty());
        // Random jumps: no rule reaches 50%.
        for i in 0..40u64 {
            let j = (i * 7919) % 101;
            m.observe(format!("k:{i}").as_bytes(), format!("k:{j}").as_bytes());
        }
        assert!(m.predict(b"k:5", 3, 0.5).is_empty());
    }

    #[test]
    fn decay_follows_a_changing_pattern() {
        let mut m = MarkovModel::default();
        for i in 0..50u64 {
            m.observe(
                format!("x:{i}").as_bytes(),
                format!("x:{}", i + 1).as_bytes(),
            );
        }
        for i in 0..80u64 {
            m.observe(
                format!("x:{i}").as_bytes(),
                format!("x:{}", i + 2).as_bytes(),
            );
        }
        assert_eq!(m.predict(b"x:10", 1, 0.5), vec![b"x:12".to_vec()]);
    }

    #[test]
    fn tables_stay_bounded() {
        let mut m = MarkovModel::default();
        for i in 0..(SHAPES_MAX as u64 + 500) {
            let a = format!(
                "{}{}",
                "p".repeat((i % 7) as usize),
                "q".repeat((i / 7) as usize % 600)
            );
            m.observe(a.as_bytes(), b"z");
        }
        assert!(m.shapes.len() <= SHAPES_MAX);
        assert!(m
            .shapes
            .values()
            .all(|s| s.rules.len() <= RULES_PER_SHAPE_MAX));
    }
}
