//! How a vector set keeps its vectors: normalized to unit length (similarity is cosine),
//! then as 32-bit floats (`NOQUANT`), as 8-bit integers scaled by the vector's largest
//! magnitude (`Q8`, the default), or as one sign bit per dimension (`BIN`). Similarity of
//! two vectors of one set is their dot product in `[-1, 1]`; for `BIN`, `1 - 2·hamming/dim`.

/// A set's quantization, chosen by its first `VADD`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Quant {
    NoQuant,
    #[default]
    Q8,
    Bin,
}

impl Quant {
    /// The name `VINFO` gives it.
    pub fn name(self) -> &'static str {
        match self {
            Quant::NoQuant => "f32",
            Quant::Q8 => "int8",
            Quant::Bin => "bin",
        }
    }

    /// Bytes a vector of `dim` dimensions takes in this form.
    pub fn bytes(self, dim: usize) -> usize {
        match self {
            Quant::NoQuant => dim * 4,
            Quant::Q8 => dim + 4,
            Quant::Bin => dim.div_ceil(64) * 8,
        }
    }
}

/// A vector as a set keeps it.
#[derive(Debug, Clone, PartialEq)]
pub enum Stored {
    F32(Box<[f32]>),
    /// Components and the scale that maps them back (`x ≈ q · scale`).
    Q8(Box<[i8]>, f32),
    Bin(Box<[u64]>),
}

/// `v` scaled to unit length, and the length it had (0 for a zero vector, left as it is).
pub fn normalize(v: &[f32]) -> (Vec<f32>, f32) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm == 0.0 || !norm.is_finite() {
        return (v.to_vec(), 0.0);
    }
    (v.iter().map(|x| x / norm).collect(), norm)
}

impl Stored {
    /// Unit vector `unit` in form `q`.
    pub fn new(q: Quant, unit: &[f32]) -> Stored {
        match q {
            Quant::NoQuant => Stored::F32(unit.into()),
            Quant::Q8 => {
                let max = unit.iter().fold(0f32, |m, x| m.max(x.abs()));
                let scale = if max == 0.0 { 1.0 } else { max / 127.0 };
                let q = unit
                    .iter()
                    .map(|x| (x / scale).round().clamp(-127.0, 127.0) as i8);
                Stored::Q8(q.collect(), scale)
            }
            Quant::Bin => {
                let mut bits = vec![0u64; unit.len().div_ceil(64)];
                for (i, x) in unit.iter().enumerate() {
                    if *x > 0.0 {
                        bits[i / 64] |= 1 << (i % 64);
                    }
                }
                Stored::Bin(bits.into())
            }
        }
    }

    /// The unit vector back (approximately, for `Q8` and `BIN`), `dim` long.
    pub fn to_f32(&self, dim: usize) -> Vec<f32> {
        match self {
            Stored::F32(v) => v.to_vec(),
            Stored::Q8(q, scale) => q.iter().map(|&x| x as f32 * scale).collect(),
            Stored::Bin(bits) => {
                let one = 1.0 / (dim as f32).sqrt();
                (0..dim)
                    .map(|i| {
                        if bits[i / 64] >> (i % 64) & 1 == 1 {
                            one
                        } else {
                            -one
                        }
                    })
                    .collect()
            }
        }
    }

    /// Cosine similarity of two vectors of one set (one form, one dimension), `dim` long.
    pub fn similarity(&self, other: &Stored, dim: usize) -> f32 {
        match (self, other) {
            (Stored::F32(a), Stored::F32(b)) => dot(a, b),
            (Stored::Q8(a, sa), Stored::Q8(b, sb)) => dot_i8(a, b) as f32 * sa * sb,
            (Stored::Bin(a), Stored::Bin(b)) => {
                let differ: u32 = a
                    .iter()
                    .zip(b.iter())
                    .map(|(x, y)| (x ^ y).count_ones())
                    .sum();
                1.0 - 2.0 * differ as f32 / dim.max(1) as f32
            }
            _ => 0.0,
        }
    }

    /// Bytes of memory the vector holds.
    pub fn bytes(&self) -> usize {
        match self {
            Stored::F32(v) => v.len() * 4,
            Stored::Q8(q, _) => q.len() + 4,
            Stored::Bin(b) => b.len() * 8,
        }
    }
}

/// The dot product of two equally long slices.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight lanes, so the compiler keeps eight sums in flight (one vector register).
    let mut s = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            s[i] += x[i] * y[i];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    s.iter().sum::<f32>() + tail
}

/// The dot product of two equally long slices of 8-bit integers.
fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    let mut s = [0i32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            s[i] += x[i] as i32 * y[i] as i32;
        }
    }
    let tail: i32 = ra.iter().zip(rb).map(|(&x, &y)| x as i32 * y as i32).sum();
    s.iter().sum::<i32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_keeps_the_similarity_of_unit_vectors_close() {
        let a = normalize(&[1.0, 2.0, 3.0, -4.0, 0.5]).0;
        let b = normalize(&[1.5, 1.0, 3.0, -3.0, -0.5]).0;
        let exact = dot(&a, &b);
        let f = Stored::new(Quant::NoQuant, &a).similarity(&Stored::new(Quant::NoQuant, &b), 5);
        let q = Stored::new(Quant::Q8, &a).similarity(&Stored::new(Quant::Q8, &b), 5);
        assert!((f - exact).abs() < 1e-6);
        assert!((q - exact).abs() < 0.02, "{q} vs {exact}");
        let same = Stored::new(Quant::Bin, &a);
        assert_eq!(same.similarity(&same, 5), 1.0);
        let opposite: Vec<f32> = a.iter().map(|x| -x).collect();
        assert_eq!(
            same.similarity(&Stored::new(Quant::Bin, &opposite), 5),
            -1.0
        );
    }

    #[test]
    fn vectors_come_back_and_zero_stays_zero() {
        let (u, norm) = normalize(&[3.0, 4.0]);
        assert_eq!((u.clone(), norm), (vec![0.6, 0.8], 5.0));
        let back = Stored::new(Quant::Q8, &u).to_f32(2);
        assert!(back.iter().zip(&u).all(|(x, y)| (x - y).abs() < 0.01));
        assert_eq!(normalize(&[0.0, 0.0]), (vec![0.0, 0.0], 0.0));
        assert_eq!(Quant::Q8.bytes(768), 772);
    }
}
