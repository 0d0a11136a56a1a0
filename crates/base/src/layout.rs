//! Composite (PFL) layouts and the striping arithmetic that maps file bytes to objects.
//!
//! A layout is a list of components with extents `[start, end)`: the first may be
//! Data-on-MDT (its bytes in the MDT's store), the others raid0 over OSTs. A raid0
//! component is instantiated (OSTs chosen, Lustre's `init` flag) lazily, when the first
//! write reaches it. Pure functions only: the client uses them to split I/O, the MDS to
//! check and instantiate layouts, the tests to check both.

use crate::limits::{
    COMPONENTS_MAX, DOM_SIZE_MAX, STRIPE_COUNT_MAX, STRIPE_SIZE_MAX, STRIPE_SIZE_UNIT,
};
use crate::Errno;
use serde::{Deserialize, Serialize};

/// End of the last component: end of file.
pub const EOF: u64 = u64::MAX;

/// How a component's bytes are stored.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum Pattern {
    /// Data-on-MDT: the bytes live in the MDT's `dom` keyspace.
    Mdt,
    /// Striped over OST objects, round robin in `stripe_size` chunks.
    Raid0 {
        /// Bytes per stripe chunk, a multiple of 64 KiB.
        stripe_size: u64,
        /// Stripes: -1 all OSTs, 0 file system default, else 1..=number of OSTs.
        stripe_count: i32,
        /// First OST wanted (-1: the MDS chooses).
        stripe_offset: i32,
        /// OST index of each stripe once instantiated; empty in a template.
        osts: Vec<u32>,
    },
}

/// One extent of a composite layout.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Component {
    /// Component id (1-based, unique in the layout), part of every object's name.
    pub id: u32,
    /// First byte covered.
    pub start: u64,
    /// One past the last byte covered; [`EOF`] for the open end.
    pub end: u64,
    /// Where the bytes go.
    pub pattern: Pattern,
}

impl Component {
    /// Instantiated (Lustre's `lcme_flags: init`): a DoM component always is, a raid0
    /// one once its OSTs are chosen.
    pub fn is_init(&self) -> bool {
        match &self.pattern {
            Pattern::Mdt => true,
            Pattern::Raid0 { osts, .. } => !osts.is_empty(),
        }
    }
}

/// Why a layout was refused: the errno for the caller and the rule, in words, for the
/// admin (the same words `lode setstripe` prints).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LayoutError {
    /// What the system call returns.
    pub errno: Errno,
    /// The rule broken.
    pub reason: &'static str,
}

impl LayoutError {
    fn inval(reason: &'static str) -> LayoutError {
        LayoutError {
            errno: Errno::EINVAL,
            reason,
        }
    }
}

impl From<LayoutError> for Errno {
    fn from(e: LayoutError) -> Errno {
        e.errno
    }
}

impl std::fmt::Display for LayoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.reason, self.errno)
    }
}

/// A composite layout (a plain layout is one component covering `[0, EOF)`).
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct Layout {
    /// Generation, bumped on every layout change.
    pub gen: u32,
    /// Components in extent order, contiguous from 0.
    pub components: Vec<Component>,
}

/// A plain striping request, as `setstripe -c -S -i` gives it.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct StripeSpec {
    /// -1 all OSTs, 0 inherit, else the count.
    pub stripe_count: i32,
    /// 0 inherit, else bytes (multiple of 64 KiB).
    pub stripe_size: u64,
    /// -1 any, else the first OST index.
    pub stripe_offset: i32,
}

/// One piece of an I/O after striping: `len` bytes of the caller's buffer at `buf_off`
/// go to object `(component, stripe)` at `obj_off`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Chunk {
    /// Index of the component in the layout.
    pub comp_idx: usize,
    /// Stripe index within the component.
    pub stripe: u32,
    /// Offset within the object.
    pub obj_off: u64,
    /// Offset within the caller's buffer.
    pub buf_off: usize,
    /// Bytes.
    pub len: usize,
}

impl Layout {
    /// A plain raid0 layout template covering the whole file.
    pub fn plain(stripe_count: i32, stripe_size: u64, stripe_offset: i32) -> Layout {
        Layout {
            gen: 0,
            components: vec![Component {
                id: 1,
                start: 0,
                end: EOF,
                pattern: Pattern::Raid0 {
                    stripe_size,
                    stripe_count,
                    stripe_offset,
                    osts: Vec::new(),
                },
            }],
        }
    }

    /// True if the layout is one component over the whole file.
    pub fn is_plain(&self) -> bool {
        self.components.len() == 1 && self.components[0].start == 0 && self.components[0].end == EOF
    }

    /// Checks a layout (or template) from outside with the largest DoM component
    /// allowed ([`DOM_SIZE_MAX`]); see [`Layout::check`].
    pub fn validate(&self, ost_count: u32) -> Result<(), Errno> {
        self.check(ost_count, DOM_SIZE_MAX).map_err(|e| e.errno)
    }

    /// Checks a layout (or template) from outside with Lustre's rules: bounded,
    /// components contiguous from 0 with ends on 64 KiB boundaries, `mdt` only as the
    /// first component and no larger than `dom_max` (the MDT's `dom_stripesize`; 0:
    /// Data-on-MDT disabled), raid0 stripe sizes dividing their component's extent,
    /// counts and OST indices within `ost_count`.
    pub fn check(&self, ost_count: u32, dom_max: u64) -> Result<(), LayoutError> {
        if self.components.is_empty() {
            return Err(LayoutError::inval("a layout needs at least one component"));
        }
        if self.components.len() > COMPONENTS_MAX {
            return Err(LayoutError::inval("too many components (at most 64)"));
        }
        let mut expect = 0u64;
        for (i, c) in self.components.iter().enumerate() {
            if c.start != expect {
                return Err(LayoutError::inval(
                    "components must be contiguous, starting at 0",
                ));
            }
            if c.end <= c.start {
                return Err(LayoutError::inval("a component must end after it starts"));
            }
            if c.end != EOF && c.end % STRIPE_SIZE_UNIT != 0 {
                return Err(LayoutError::inval(
                    "component end must be a multiple of 64 KiB",
                ));
            }
            if c.id == 0 || self.components[..i].iter().any(|o| o.id == c.id) {
                return Err(LayoutError::inval(
                    "component ids must be unique and non-zero",
                ));
            }
            match &c.pattern {
                Pattern::Mdt => {
                    if i != 0 {
                        return Err(LayoutError::inval("'mdt' layout can be only the first one"));
                    }
                    if c.end == EOF || c.end > DOM_SIZE_MAX {
                        return Err(LayoutError {
                            errno: Errno::EFBIG,
                            reason: "'mdt' layout size is too big (at most 1 GiB)",
                        });
                    }
                    if dom_max == 0 {
                        return Err(LayoutError::inval(
                            "Data-on-MDT is disabled on this MDT (lod.*.dom_stripesize=0)",
                        ));
                    }
                    if c.end > dom_max {
                        return Err(LayoutError::inval(
                            "'mdt' component is larger than lod.*.dom_stripesize",
                        ));
                    }
                }
                Pattern::Raid0 {
                    stripe_size,
                    stripe_count,
                    stripe_offset,
                    osts,
                } => {
                    if *stripe_size == 0
                        || stripe_size % STRIPE_SIZE_UNIT != 0
                        || *stripe_size > STRIPE_SIZE_MAX
                    {
                        return Err(LayoutError::inval(
                            "stripe size must be a multiple of 64 KiB, below 4 GiB",
                        ));
                    }
                    if *stripe_count < -1 || *stripe_count > STRIPE_COUNT_MAX as i32 {
                        return Err(LayoutError::inval("stripe count must be -1, 0 or 1..2000"));
                    }
                    if *stripe_offset < -1
                        || (*stripe_offset >= 0 && *stripe_offset as u32 >= ost_count)
                    {
                        return Err(LayoutError::inval("stripe index names no OST"));
                    }
                    if !osts.is_empty()
                        && (osts.len() as i64 != i64::from(*stripe_count)
                            || osts.iter().any(|&o| o >= ost_count))
                    {
                        return Err(LayoutError::inval("objects name OSTs that do not exist"));
                    }
                    // An extent boundary inside a stripe chunk would split chunks across
                    // components.
                    if c.end != EOF && c.end % stripe_size != 0 {
                        return Err(LayoutError::inval(
                            "component end must be a multiple of its stripe size",
                        ));
                    }
                }
            }
            expect = c.end;
        }
        Ok(())
    }

    /// The Data-on-MDT component's end (0: none): bytes below it live on the MDT.
    pub fn dom_end(&self) -> u64 {
        match self.components.first() {
            Some(c) if c.pattern == Pattern::Mdt => c.end,
            _ => 0,
        }
    }

    /// True if some raid0 component has OSTs chosen (its objects may hold data).
    pub fn has_objects(&self) -> bool {
        self.components
            .iter()
            .any(|c| matches!(&c.pattern, Pattern::Raid0 { osts, .. } if !osts.is_empty()))
    }

    /// Indices of the components that `[off, off+len)` touches and that are not
    /// instantiated yet.
    pub fn uninit_in(&self, off: u64, len: u64) -> Vec<usize> {
        let end = off.saturating_add(len.max(1));
        self.components
            .iter()
            .enumerate()
            .filter(|(_, c)| c.start < end && c.end > off && !c.is_init())
            .map(|(i, _)| i)
            .collect()
    }

    /// Fits an inherited template to the MDT's `dom_stripesize` as Lustre does: a DoM
    /// component larger than `dom_max` is cut to it (the next component then starts
    /// there); with `dom_max` 0 it is dropped when another component follows. `None`:
    /// a DoM-only template while Data-on-MDT is disabled.
    pub fn fit_dom(mut self, dom_max: u64) -> Option<Layout> {
        let end = self.dom_end();
        if end == 0 || end <= dom_max {
            return Some(self);
        }
        if dom_max == 0 {
            if self.components.len() < 2 {
                return None;
            }
            self.components.remove(0);
            self.components[0].start = 0;
            return Some(self);
        }
        self.components[0].end = dom_max;
        if let Some(next) = self.components.get_mut(1) {
            next.start = dom_max;
        }
        Some(self)
    }

    /// Index of the component holding byte `off`, if any.
    pub fn component_at(&self, off: u64) -> Option<usize> {
        self.components
            .iter()
            .position(|c| off >= c.start && off < c.end)
    }

    /// End of the last component: bytes at or past it cannot be written (ENODATA).
    pub fn end(&self) -> u64 {
        self.components.last().map_or(0, |c| c.end)
    }

    /// Splits `[off, off+len)` into per-object chunks. Bytes past the layout's end are
    /// not returned; the caller turns that into ENODATA.
    pub fn map(&self, off: u64, len: usize) -> Vec<Chunk> {
        let mut out = Vec::new();
        let mut pos = off;
        let end = off.saturating_add(len as u64);
        while pos < end {
            let Some(ci) = self.component_at(pos) else {
                break;
            };
            let c = &self.components[ci];
            let stop = end.min(c.end);
            match &c.pattern {
                Pattern::Mdt => {
                    out.push(Chunk {
                        comp_idx: ci,
                        stripe: 0,
                        obj_off: pos,
                        buf_off: (pos - off) as usize,
                        len: (stop - pos) as usize,
                    });
                    pos = stop;
                }
                Pattern::Raid0 {
                    stripe_size,
                    osts,
                    stripe_count,
                    ..
                } => {
                    let count = if osts.is_empty() {
                        (*stripe_count).max(1) as u64
                    } else {
                        osts.len() as u64
                    };
                    let ss = *stripe_size;
                    while pos < stop {
                        let rel = pos - c.start;
                        let chunk_no = rel / ss;
                        let within = rel % ss;
                        let n = (ss - within).min(stop - pos);
                        out.push(Chunk {
                            comp_idx: ci,
                            stripe: (chunk_no % count) as u32,
                            obj_off: (chunk_no / count) * ss + within,
                            buf_off: (pos - off) as usize,
                            len: n as usize,
                        });
                        pos += n;
                    }
                }
            }
        }
        out
    }
}

/// File size implied by one raid0 object of `obj_size` bytes: the offset just past its
/// last byte, in file terms.
pub fn file_size_from_object(
    comp_start: u64,
    stripe_size: u64,
    count: u32,
    stripe: u32,
    obj_size: u64,
) -> u64 {
    if obj_size == 0 {
        return 0;
    }
    let last = obj_size - 1;
    let row = last / stripe_size;
    let within = last % stripe_size;
    comp_start + (row * u64::from(count) + u64::from(stripe)) * stripe_size + within + 1
}

/// The file offset of byte `obj_off` of raid0 object `stripe` (a seek's answer from
/// an OST, in the file's terms).
pub fn file_offset_from_object(
    comp_start: u64,
    stripe_size: u64,
    count: u32,
    stripe: u32,
    obj_off: u64,
) -> u64 {
    let row = obj_off / stripe_size;
    row.saturating_mul(u64::from(count))
        .saturating_add(u64::from(stripe))
        .saturating_mul(stripe_size)
        .saturating_add(obj_off % stripe_size)
        .saturating_add(comp_start)
}

/// Size object `stripe` must have when the component's part of the file is `rel_size`
/// bytes long (truncate).
pub fn object_size_for_file(stripe_size: u64, count: u32, stripe: u32, rel_size: u64) -> u64 {
    let count = u64::from(count);
    let full_rows = rel_size / (stripe_size * count);
    let rem = rel_size % (stripe_size * count);
    let mut size = full_rows * stripe_size;
    let start_in_row = u64::from(stripe) * stripe_size;
    if rem > start_in_row {
        size += (rem - start_in_row).min(stripe_size);
    }
    size
}

/// Magic at the start of the `lustre.lov` xattr value (lode's own encoding).
pub const LOV_XATTR_MAGIC: &[u8; 4] = b"LOV1";

/// Encodes a layout as the `lustre.lov` xattr value: magic, then postcard.
pub fn encode_xattr(l: &Layout) -> Vec<u8> {
    let mut v = LOV_XATTR_MAGIC.to_vec();
    v.extend_from_slice(&postcard::to_stdvec(l).unwrap_or_default());
    v
}

/// Decodes a `lustre.lov` xattr value; `None` if it is not one.
pub fn decode_xattr(v: &[u8]) -> Option<Layout> {
    let rest = v.strip_prefix(LOV_XATTR_MAGIC.as_slice())?;
    postcard::from_bytes(rest).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn raid0(count: u32, ss: u64) -> Layout {
        let mut l = Layout::plain(count as i32, ss, -1);
        if let Pattern::Raid0 { osts, .. } = &mut l.components[0].pattern {
            *osts = (0..count).collect();
        }
        l
    }

    #[test]
    fn map_splits_at_stripe_boundaries() {
        let l = raid0(2, 65536);
        let c = l.map(60000, 10000);
        assert_eq!(c.len(), 2);
        assert_eq!(
            c[0],
            Chunk {
                comp_idx: 0,
                stripe: 0,
                obj_off: 60000,
                buf_off: 0,
                len: 5536
            }
        );
        assert_eq!(
            c[1],
            Chunk {
                comp_idx: 0,
                stripe: 1,
                obj_off: 0,
                buf_off: 5536,
                len: 4464
            }
        );
    }

    #[test]
    fn validate_refuses_bad_layouts() {
        assert!(Layout::plain(1, 1 << 20, -1).validate(2).is_ok());
        assert!(Layout::plain(1, 1000, -1).validate(2).is_err());
        assert!(Layout::plain(-2, 1 << 20, -1).validate(2).is_err());
        assert!(Layout::plain(1, 1 << 20, 2).validate(2).is_err());
        assert!(Layout {
            gen: 0,
            components: vec![]
        }
        .validate(2)
        .is_err());
    }

    fn comp(id: u32, start: u64, end: u64, pattern: Pattern) -> Component {
        Component {
            id,
            start,
            end,
            pattern,
        }
    }

    fn r0(ss: u64, count: i32) -> Pattern {
        Pattern::Raid0 {
            stripe_size: ss,
            stripe_count: count,
            stripe_offset: -1,
            osts: Vec::new(),
        }
    }

    #[test]
    fn lustres_composite_rules() {
        const M: u64 = 1 << 20;
        let l = |c: Vec<Component>| Layout {
            gen: 0,
            components: c,
        };
        // The seed's four components: DoM, then 1, 4 and all OSTs.
        let seed = l(vec![
            comp(1, 0, M, Pattern::Mdt),
            comp(2, M, 64 * M, r0(M, 1)),
            comp(3, 64 * M, 8 << 30, r0(M, 4)),
            comp(4, 8 << 30, EOF, r0(4 * M, -1)),
        ]);
        assert_eq!(seed.check(14, M), Ok(()));
        assert_eq!(seed.dom_end(), M);
        assert!(!seed.has_objects());
        assert_eq!(seed.uninit_in(0, 4096), Vec::<usize>::new());
        assert_eq!(seed.uninit_in(M - 1, 2), vec![1]);
        assert_eq!(seed.uninit_in(0, 9 << 30), vec![1, 2, 3]);
        let reason = |x: &Layout, dom| x.check(14, dom).unwrap_err().reason;
        // DoM larger than dom_stripesize, or DoM disabled.
        assert!(reason(&seed, 64 << 10).contains("dom_stripesize"));
        assert!(reason(&seed, 0).contains("disabled"));
        // `mdt` only first; never to EOF; at most 1 GiB (EFBIG).
        let second = l(vec![
            comp(1, 0, M, r0(M, 1)),
            comp(2, M, 2 * M, Pattern::Mdt),
        ]);
        assert!(reason(&second, M).contains("only the first"));
        let to_eof = l(vec![comp(1, 0, EOF, Pattern::Mdt)]);
        assert_eq!(to_eof.check(1, M).unwrap_err().errno, Errno::EFBIG);
        let huge = l(vec![comp(1, 0, 2 << 30, Pattern::Mdt)]);
        assert_eq!(huge.check(1, DOM_SIZE_MAX).unwrap_err().errno, Errno::EFBIG);
        // Extents: contiguous from 0, on 64 KiB boundaries, stripe size dividing them.
        let gap = l(vec![comp(1, 0, M, r0(M, 1)), comp(2, 2 * M, EOF, r0(M, 1))]);
        assert!(reason(&gap, M).contains("contiguous"));
        let odd = l(vec![
            comp(1, 0, 100_000, r0(65536, 1)),
            comp(2, 100_000, EOF, r0(M, 1)),
        ]);
        assert!(reason(&odd, M).contains("64 KiB"));
        let split = l(vec![
            comp(1, 0, M, r0(768 << 10, 1)),
            comp(2, M, EOF, r0(M, 1)),
        ]);
        assert!(reason(&split, M).contains("its stripe size"));
        // A layout may end before EOF (writes past it get ENODATA).
        let dom_only = l(vec![comp(1, 0, M, Pattern::Mdt)]);
        assert_eq!(dom_only.check(1, M), Ok(()));
        assert_eq!(dom_only.end(), M);
        assert_eq!(
            dom_only
                .map(M - 10, 100)
                .iter()
                .map(|c| c.len)
                .sum::<usize>(),
            10
        );
    }

    #[test]
    fn inherited_dom_is_fitted_to_dom_stripesize() {
        const M: u64 = 1 << 20;
        let l = Layout {
            gen: 0,
            components: vec![comp(1, 0, M, Pattern::Mdt), comp(2, M, EOF, r0(M, 1))],
        };
        let cut = l.clone().fit_dom(256 << 10).expect("fitted");
        assert_eq!(cut.components[0].end, 256 << 10);
        assert_eq!(cut.components[1].start, 256 << 10);
        assert_eq!(cut.check(1, 256 << 10), Ok(()));
        let gone = l.clone().fit_dom(0).expect("fitted");
        assert_eq!(gone.components.len(), 1);
        assert_eq!(gone.components[0].start, 0);
        assert_eq!(gone.check(1, 0), Ok(()));
        let only = Layout {
            gen: 0,
            components: vec![comp(1, 0, M, Pattern::Mdt)],
        };
        assert_eq!(only.clone().fit_dom(0), None);
        assert_eq!(only.fit_dom(64 << 10).expect("cut").end(), 64 << 10);
    }

    proptest! {
        #[test]
        fn sizes_round_trip(count in 1u32..5, ss_units in 1u64..4, size in 0u64..2_000_000) {
            let ss = ss_units * 65536;
            // The file size is the max over objects of the size each implies.
            let implied = (0..count)
                .map(|s| file_size_from_object(0, ss, count, s, object_size_for_file(ss, count, s, size)))
                .max()
                .unwrap();
            prop_assert_eq!(implied, size);
        }

        #[test]
        fn object_offsets_map_back_to_the_file(count in 1u32..5, ss_units in 1u64..4, off in 0u64..2_000_000) {
            let ss = ss_units * 65536;
            let l = raid0(count, ss);
            let c = l.map(off, 1)[0];
            prop_assert_eq!(file_offset_from_object(0, ss, count, c.stripe, c.obj_off), off);
            // Each object's first byte at or past `off` is the object's size for a file
            // that ends at `off`.
            for s in 0..count {
                let o = object_size_for_file(ss, count, s, off);
                prop_assert!(file_offset_from_object(0, ss, count, s, o) >= off);
                if o > 0 {
                    prop_assert!(file_offset_from_object(0, ss, count, s, o - 1) < off);
                }
            }
        }

        #[test]
        fn map_covers_every_byte_once(count in 1u32..5, off in 0u64..1_000_000, len in 0usize..300_000) {
            let l = raid0(count, 65536);
            let chunks = l.map(off, len);
            let total: usize = chunks.iter().map(|c| c.len).sum();
            prop_assert_eq!(total, len);
            let mut pos = 0;
            for c in &chunks {
                prop_assert_eq!(c.buf_off, pos);
                pos += c.len;
            }
        }
    }
}
