//! What every command on a non-string kind does the same way: read the value if the key
//! holds that kind (`WRONGTYPE` otherwise), change it by a read-modify-write under the key's
//! lock (the key keeps its expiry; a value left empty deletes its key, as in Redis), or
//! overwrite it whole (the `STORE` forms).

use std::time::Duration;

use bytes::Bytes;
use strata_engine::{Answer, Asked, Change, Key, Kind, Source};
use strata_resp::Reply;

use super::blocks::BlockDeque;
use super::ctx::{engine_error, wrong_type, Ctx};
use super::items::{own, past_list_delta, Items};
use super::packed::{Indexed, MemberPack};

/// What a read-modify-write does to its value.
pub(crate) enum Edit {
    /// Nothing changes.
    Keep,
    /// The value becomes these bytes.
    Put(Vec<u8>),
    /// The key is deleted (the value was left empty).
    Delete,
}

/// A stored value that failed to decode as its kind.
pub(crate) fn corrupt(kind: Kind, e: strata_format::FormatError) -> strata_engine::Error {
    strata_engine::Error::Data(format!("{} value: {e}", kind.name()))
}

/// The value at `key` if it holds `kind`: `None` if the key holds nothing, `WRONGTYPE` if
/// it holds another kind.
pub(crate) async fn read_kind(
    ctx: &mut Ctx<'_>,
    key: &Key,
    kind: Kind,
) -> Result<Option<Bytes>, Reply> {
    let engine = &ctx.shared.engine;
    engine.note_access(ctx.conn.id, key);
    match engine.get_value(key).await {
        Ok(None) => Ok(None),
        Ok(Some((k, v))) if k == kind => Ok(Some(v)),
        Ok(Some(_)) => Err(wrong_type()),
        Err(e) => Err(engine_error(&e)),
    }
}

/// The read-modify-write of the value of `kind` at `key`: `f` sees the value (`None` if the
/// key holds nothing) and says what becomes of it.
pub(crate) async fn write_kind<R: Send + 'static>(
    ctx: &mut Ctx<'_>,
    key: &Key,
    kind: Kind,
    f: impl FnOnce(Option<&Bytes>) -> strata_engine::Result<(Edit, R)> + Send,
) -> Result<R, Reply> {
    let r = ctx
        .shared
        .engine
        .update(key, true, move |cur| {
            let (value, expire_ms) = match &cur {
                None => (None, 0),
                Some(c) if c.kind != kind => return Err(strata_engine::Error::WrongType),
                Some(c) => (Some(c.value.expect("value requested")), c.expire_ms),
            };
            let (edit, out) = f(value)?;
            let change = match edit {
                Edit::Keep => None,
                Edit::Delete => cur.is_some().then_some(Change::Delete),
                Edit::Put(v) => Some(Change::Put {
                    kind,
                    value: Bytes::from(v),
                    expire_ms,
                }),
            };
            let changed = change.is_some();
            Ok((change, (changed, out)))
        })
        .await;
    written(ctx, key, kind, r)
}

/// The result of a write of `key` (of `kind`) that says whether it changed it: its ticket
/// deferred to the reply and, when it changed the key, [`changed`] told.
pub(crate) fn written<R>(
    ctx: &mut Ctx<'_>,
    key: &Key,
    kind: Kind,
    r: strata_engine::Result<strata_engine::Written<(bool, R)>>,
) -> Result<R, Reply> {
    match r {
        Ok(w) => {
            let (written, out) = ctx.defer(w);
            if written {
                changed(ctx, key, kind);
            }
            Ok(out)
        }
        Err(e) => Err(engine_error(&e)),
    }
}

/// After a write changed `key` (now of `kind`): its watchers' transactions fail (also when
/// the write is a blocked pop's, which ran long after its command was dispatched), and a
/// list or a sorted set may have what a blocked pop waits for.
pub(crate) fn changed(ctx: &Ctx<'_>, key: &Key, kind: Kind) {
    ctx.shared.watches.touch(key);
    if matches!(kind, Kind::List | Kind::ZSet) {
        ctx.shared.blocked.wake(key);
    }
}

/// Replaces whatever `key` holds with `value` of `kind`, without expiry, or deletes the key
/// when `value` is `None` (an empty result), as the `STORE` commands do.
pub(crate) async fn store_kind(
    ctx: &mut Ctx<'_>,
    key: &Key,
    kind: Kind,
    value: Option<Vec<u8>>,
) -> Result<(), Reply> {
    let r = ctx
        .shared
        .engine
        .update(key, false, move |cur| {
            let change = match value {
                Some(v) => Some(Change::Put {
                    kind,
                    value: Bytes::from(v),
                    expire_ms: 0,
                }),
                None => cur.is_some().then_some(Change::Delete),
            };
            let written = change.is_some();
            Ok((change, written))
        })
        .await;
    match r {
        Ok(w) => {
            // An empty result stored over no key changes nothing, and touches nothing.
            if ctx.defer(w) {
                changed(ctx, key, kind);
            }
            Ok(())
        }
        Err(e) => Err(engine_error(&e)),
    }
}

/// The reply of a command that ran or was refused.
pub(crate) fn reply<R>(r: Result<R, Reply>, f: impl FnOnce(R) -> Reply) -> Reply {
    r.map_or_else(|e| e, f)
}

/// A bulk reply copied from `b`.
pub(crate) fn bulk(b: &[u8]) -> Reply {
    Reply::Bulk(Bytes::copy_from_slice(b))
}

/// How a kind's value decodes into items (sharing its buffer) and encodes back.
pub(crate) trait Codec: Send + 'static {
    type Item: Send + 'static;
    /// What a write changes the items in (and a live value keeps them in).
    type Items: Items<Self::Item>;
    const KIND: Kind;
    /// The live items of `value` at `now_ms` (a hash drops its expired fields).
    fn decode(value: &Bytes, now_ms: u64) -> strata_format::Result<Vec<Self::Item>>;
    fn encode(items: &[Self::Item]) -> Vec<u8>;
    /// Whether `item` expires on its own (a hash field with a TTL): a value holding one
    /// is not kept live, where nothing would drop it when it expires.
    fn expires(_item: &Self::Item) -> bool {
        false
    }
}

// Hashed and compared as the bytes they hold, as `Borrow<[u8]>` requires.
/// A collection's items as the engine keeps them live between commands
/// ([`strata_engine::LiveValue`]): changed in place, encoded when the engine stores them.
struct LiveItems<C: Codec, T> {
    items: T,
    /// Bytes per item, as stored when decoded plus the item itself: `bytes` in constant
    /// time.
    item_bytes: usize,
    stays: bool,
    codec: std::marker::PhantomData<C>,
}

impl<C: Codec, T: Items<C::Item>> LiveItems<C, T> {
    /// Bytes per item of `len` items stored in `stored` bytes: as decoded, and the item's
    /// share of what was stored.
    fn item_bytes(stored: usize, len: usize) -> usize {
        std::mem::size_of::<C::Item>() + T::EXTRA_BYTES + stored / len.max(1)
    }

    fn decode(value: Option<&Bytes>, now_ms: u64) -> strata_engine::Result<Self> {
        if let Some(v) = value {
            // Read in place: nothing in it expires on its own.
            if let Some(items) = T::from_stored(v).map_err(|e| corrupt(C::KIND, e))? {
                return Ok(LiveItems {
                    item_bytes: Self::item_bytes(v.len(), items.len()),
                    stays: true,
                    items,
                    codec: std::marker::PhantomData,
                });
            }
        }
        let items = match value {
            Some(v) => C::decode(v, now_ms).map_err(|e| corrupt(C::KIND, e))?,
            None => Vec::new(),
        };
        let stored = value.map_or(0, |v| v.len());
        Ok(LiveItems {
            item_bytes: Self::item_bytes(stored, items.len()),
            stays: !items.iter().any(C::expires),
            items: T::from_vec(items),
            codec: std::marker::PhantomData,
        })
    }
}

impl<C: Codec, T: Items<C::Item>> strata_engine::LiveValue for LiveItems<C, T> {
    fn encode(&mut self) -> Bytes {
        let value = self.items.encode_stored(C::encode);
        self.items.stored();
        // A value grown in place (from nothing, or by larger items) is counted as it is.
        self.item_bytes = Self::item_bytes(value.len(), self.items.len());
        value
    }
    fn delta(&mut self) -> Option<Vec<u8>> {
        self.items.delta(C::encode)
    }
    fn bytes(&self) -> usize {
        (self.items.live_bytes()).unwrap_or(self.items.len() * self.item_bytes)
    }
    fn is_empty(&self) -> bool {
        self.items.len() == 0
    }
    fn items(&self) -> Option<usize> {
        Some(self.items.len())
    }
    fn moves(&self) -> usize {
        self.items.moves()
    }
    fn stays(&self) -> bool {
        self.stays
    }
}

/// A list's elements, pushed and popped at both ends, read through `Deref`; its changes are
/// noted in order (pushes, pops, sets, inserts, removals:
/// [`strata_format::delta::ListDelta`]), so a large list's few changes are logged as a
/// delta. Passing as many changes as elements makes the next record a whole one.
pub(crate) struct Deque {
    items: BlockDeque<Bytes>,
    /// `None`: changed whole since the last delta or store.
    ops: Option<strata_format::delta::ListDelta>,
    noted: usize,
    /// The elements its inserts and removals in the middle moved since the last delta: those
    /// on each one's shorter side, as a list stored as parts moves them.
    moved: usize,
}

impl std::ops::Deref for Deque {
    type Target = BlockDeque<Bytes>;
    fn deref(&self) -> &BlockDeque<Bytes> {
        &self.items
    }
}

impl Deque {
    fn note(&mut self, f: impl FnOnce(&mut strata_format::delta::ListDelta)) {
        if let Some(d) = &mut self.ops {
            f(d);
            self.noted += 1;
            if past_list_delta(self.noted, self.items.len()) {
                self.ops = None;
            }
        }
    }

    /// Adds a copy of `e` ([`own`]) at the head.
    pub(crate) fn push_front(&mut self, e: &[u8]) {
        self.note(|d| d.push_front(e));
        self.items.push_front(own(e));
    }

    /// Adds a copy of `e` ([`own`]) at the tail.
    pub(crate) fn push_back(&mut self, e: &[u8]) {
        self.note(|d| d.push_back(e));
        self.items.push_back(own(e));
    }

    /// The element at the head (`front`) or the tail, taken off.
    pub(crate) fn pop(&mut self, front: bool) -> Option<Bytes> {
        let e = match front {
            true => self.items.pop_front(),
            false => self.items.pop_back(),
        };
        if e.is_some() {
            self.note(|d| match front {
                true => d.pop_front(1),
                false => d.pop_back(1),
            });
        }
        e
    }

    /// Up to `n` elements off the head, in order.
    pub(crate) fn take_front(&mut self, n: usize) -> Vec<Bytes> {
        let n = n.min(self.items.len());
        if n > 0 {
            self.note(|d| d.pop_front(n));
        }
        (0..n).filter_map(|_| self.items.pop_front()).collect()
    }

    /// Up to `n` elements off the tail, the last first.
    pub(crate) fn take_back(&mut self, n: usize) -> Vec<Bytes> {
        let n = n.min(self.items.len());
        if n > 0 {
            self.note(|d| d.pop_back(n));
        }
        (0..n).filter_map(|_| self.items.pop_back()).collect()
    }

    /// Sets the element at `i` (inside the list) to a copy of `e` ([`own`]).
    pub(crate) fn set(&mut self, i: usize, e: &[u8]) {
        self.note(|d| d.set(i, e));
        self.items.set(i, own(e));
    }

    /// Inserts a copy of `e` ([`own`]) before the element at `i` (at the end if `i` is the length).
    pub(crate) fn insert(&mut self, i: usize, e: &[u8]) {
        self.moved += i.min(self.items.len() - i);
        self.note(|d| d.insert(i, e));
        self.items.insert(i, own(e));
    }

    /// Removes the elements whose flag in `keep` is false (one flag per element), in one
    /// pass; each is noted as a removal, the last first, so every index noted is where the
    /// element stood when it went. Returns how many went.
    pub(crate) fn remove_flagged(&mut self, keep: &[bool]) -> usize {
        debug_assert_eq!(keep.len(), self.items.len());
        let gone: Vec<usize> = (0..keep.len()).rev().filter(|&i| !keep[i]).collect();
        for (k, &i) in gone.iter().enumerate() {
            self.moved += i.min(keep.len() - k - 1 - i);
            self.note(|d| d.remove(i));
        }
        self.items.retain_flagged(keep);
        gone.len()
    }

    /// The elements, changed in any way (a whole change; the tests' way to make one).
    #[cfg(test)]
    pub(crate) fn whole_mut(&mut self) -> &mut BlockDeque<Bytes> {
        self.ops = None;
        &mut self.items
    }

    /// The delta noted so far (`None`: a whole change), and a new one started.
    fn take_ops(&mut self) -> Option<Vec<u8>> {
        self.noted = 0;
        self.moved = 0;
        self.ops
            .replace(Default::default())
            .map(strata_format::delta::ListDelta::finish)
    }
}

/// A list's elements are encoded in the members format ([`ListCodec`]'s), straight from
/// their blocks: `encode_with`'s `encode` is that codec's and goes unused.
impl Items<Bytes> for Deque {
    fn from_vec(items: Vec<Bytes>) -> Self {
        Deque {
            items: items.into_iter().collect(),
            ops: Some(Default::default()),
            noted: 0,
            moved: 0,
        }
    }
    fn len(&self) -> usize {
        self.items.len()
    }
    fn encode_with(&self, _encode: fn(&[Bytes]) -> Vec<u8>) -> Vec<u8> {
        strata_format::members::encode_members_from(self.items.iter().map(|e| &e[..]))
    }
    fn delta(&mut self, _encode: fn(&[Bytes]) -> Vec<u8>) -> Option<Vec<u8>> {
        self.take_ops()
    }
    fn stored(&mut self) {
        self.take_ops();
    }
    fn moves(&self) -> usize {
        self.moved
    }
}

/// A codec of the byte strings of a set or a list: one format, `strata_format::members`,
/// each kind with its own container.
macro_rules! members_codec {
    ($(#[$doc:meta])* $name:ident, $items:ty, $kind:expr) => {
        $(#[$doc])*
        pub(crate) struct $name;

        impl Codec for $name {
            type Item = Bytes;
            type Items = $items;
            const KIND: Kind = $kind;
            fn decode(value: &Bytes, _now_ms: u64) -> strata_format::Result<Vec<Bytes>> {
                Ok(strata_format::members::decode_members(value)?
                    .into_iter()
                    .map(|m| value.slice_ref(m))
                    .collect())
            }
            fn encode(items: &[Bytes]) -> Vec<u8> {
                strata_format::members::encode_members(items)
            }
        }
    };
}

members_codec!(
    /// A set's members, in the order they were added.
    SetCodec,
    Indexed<MemberPack>,
    Kind::Set
);
members_codec!(
    /// A list's elements, head first (pushed and popped at both ends).
    ListCodec,
    Deque,
    Kind::List
);

/// The items of the value of `C`'s kind at the client key `key` (none if absent).
pub(crate) async fn read_items<C: Codec>(
    ctx: &mut Ctx<'_>,
    key: &[u8],
) -> Result<Vec<C::Item>, Reply> {
    let key = ctx.key(key);
    let now = ctx.shared.engine.now_ms();
    match read_kind(ctx, &key, C::KIND).await? {
        Some(v) => C::decode(&v, now).map_err(|e| engine_error(&corrupt(C::KIND, e))),
        None => Ok(Vec::new()),
    }
}

/// A read of the items of `C`'s kind at `key` in place, from the live value the engine
/// keeps decoded ([`strata_engine::Engine::read_live`]; a collection read again soon gets
/// one): what `f` answers, or `None` when there is no live value to read (the caller reads
/// the stored value). `f` runs under a lock: it answers, it does not wait.
pub(crate) fn read_live<C: Codec, R>(
    ctx: &Ctx<'_>,
    key: &Key,
    f: impl FnOnce(&mut C::Items) -> R,
) -> Option<Result<R, Reply>> {
    let engine = &ctx.shared.engine;
    let r = engine.read_live(
        key,
        C::KIND,
        // The clock is read only when a value is decoded (a live value needs none).
        |value| {
            let now = engine.now_ms();
            Ok(Box::new(LiveItems::<C, C::Items>::decode(value, now)?))
        },
        |live| {
            let any: &mut dyn std::any::Any = live;
            let items = any
                .downcast_mut::<LiveItems<C, C::Items>>()
                .expect("a live value of this kind is this codec's");
            f(&mut items.items)
        },
    );
    match r {
        Ok(Some(r)) => {
            engine.note_access(ctx.conn.id, key);
            Some(Ok(r))
        }
        Ok(None) => None,
        Err(e) => Some(Err(engine_error(&e))),
    }
}

/// The members of the list (`LIST`) or set at the client key `key`, as slices of its
/// value (no `Bytes` per member), for the reads that answer with a few members or none
/// (`SISMEMBER`, `LRANGE`...): `f` sees them (none if the key is absent) and the value they
/// are cut from, to `slice_ref` what the reply returns.
pub(crate) async fn read_members<const LIST: bool>(
    ctx: &mut Ctx<'_>,
    key: &[u8],
    f: impl FnOnce(&[&[u8]], &Source<'_>) -> Reply + Send,
) -> Reply {
    read_named_members::<LIST>(ctx, key, None, f).await
}

/// [`read_members`] of a read that needs the members `names` alone: `f` may see those of
/// them the set holds, not all (a set stored as parts is read by name).
pub(crate) async fn read_named_members<const LIST: bool>(
    ctx: &mut Ctx<'_>,
    key: &[u8],
    names: Option<&[Bytes]>,
    f: impl FnOnce(&[&[u8]], &Source<'_>) -> Reply + Send,
) -> Reply {
    let kind = if LIST { Kind::List } else { Kind::Set };
    let key = ctx.key(key);
    let r = read_named_with(ctx, &key, kind, names, |v| match v {
        Some(v) => {
            let members =
                strata_format::members::decode_members(v.bytes()).map_err(|e| corrupt(kind, e))?;
            Ok(f(&members, v))
        }
        None => Ok(f(&[], &Source::lent(&[]))),
    });
    r.await.unwrap_or_else(|e| e)
}

/// How many items the collection of `kind` at `key` holds (`SCARD`, `ZCARD`, `LLEN`): its
/// record's count when it is stored as parts and not in memory (no part is read), else
/// `count` of its stored value; 0 if the key holds nothing.
pub(crate) async fn read_count(
    ctx: &mut Ctx<'_>,
    key: &Key,
    kind: Kind,
    count: impl FnOnce(&[u8]) -> strata_format::Result<usize> + Send,
) -> Reply {
    let whole = |v: Option<&Source<'_>>| {
        let n = v.map_or(Ok(0), |v| count(v.bytes()));
        Ok(Reply::Integer(n.map_err(|e| corrupt(kind, e))? as i64))
    };
    read_asked(ctx, key, kind, Asked::Count, whole, |a| match a {
        Answer::Items(_, n) => Reply::Integer(n as i64),
        _ => wrong_type(),
    })
    .await
}

/// A read of the collection of `kind` at `key` past its live value that one stored as
/// parts (and not in memory) answers from what `asked` reads of it
/// ([`strata_engine::Engine::get_asked_with`]): `parted` answers from what its parts gave;
/// otherwise `whole` answers from the value (`None`: the key holds nothing).
pub(crate) async fn read_asked(
    ctx: &mut Ctx<'_>,
    key: &Key,
    kind: Kind,
    asked: Asked<'_>,
    whole: impl FnOnce(Option<&Source<'_>>) -> strata_engine::Result<Reply> + Send,
    parted: impl FnOnce(Answer<Reply>) -> Reply,
) -> Reply {
    let engine = &ctx.shared.engine;
    engine.note_access(ctx.conn.id, key);
    let mut whole = Some(whole);
    let got = engine.get_asked_with(key, asked, |k, v| {
        if k != kind {
            return Err(strata_engine::Error::WrongType);
        }
        (whole.take().expect("called once"))(Some(&v))
    });
    match got.await {
        Ok(Some(Answer::Read(r))) => r,
        Ok(Some(a)) if a.kind() == Some(kind) => parted(a),
        Ok(Some(_)) => wrong_type(),
        Ok(None) => (whole.take().expect("not called"))(None).unwrap_or_else(|e| engine_error(&e)),
        Err(e) => engine_error(&e),
    }
}

/// [`read_kind`] for a read that answers with parts of the value: `f` sees it lent (no
/// copy of the whole value; [`Source::cut`] takes the parts), or `None` if the key holds
/// nothing.
pub(crate) async fn read_kind_with<R>(
    ctx: &mut Ctx<'_>,
    key: &Key,
    kind: Kind,
    f: impl FnOnce(Option<&Source<'_>>) -> strata_engine::Result<R> + Send,
) -> Result<R, Reply> {
    read_named_with(ctx, key, kind, None, f).await
}

/// [`read_kind_with`] of a read that needs the items `names` alone (given): `f` may see a
/// value holding just those of them there are ([`strata_engine::Engine::get_named_with`]:
/// a hash, set or sorted set stored as parts is read by name; a list's parts have no
/// names).
pub(crate) async fn read_named_with<R>(
    ctx: &mut Ctx<'_>,
    key: &Key,
    kind: Kind,
    names: Option<&[Bytes]>,
    f: impl FnOnce(Option<&Source<'_>>) -> strata_engine::Result<R> + Send,
) -> Result<R, Reply> {
    let engine = &ctx.shared.engine;
    engine.note_access(ctx.conn.id, key);
    let mut f = Some(f);
    let read = |k, v: Source<'_>| {
        if k != kind {
            return Err(strata_engine::Error::WrongType);
        }
        (f.take().expect("called once"))(Some(&v))
    };
    let got = match names {
        Some(names) => engine.get_named_with(key, names, read).await,
        None => engine.get_value_with(key, read).await,
    };
    match got {
        Ok(Some(r)) => Ok(r),
        Ok(None) => (f.take().expect("not called"))(None).map_err(|e| engine_error(&e)),
        Err(e) => Err(engine_error(&e)),
    }
}

/// The read-modify-write of the items at `key`, in place while the engine keeps them live
/// ([`strata_engine::Engine::update_live`]): `f` changes them and says whether it did, and
/// changes nothing when it fails; a value left with no items deletes its key.
pub(crate) async fn write_items<C: Codec, R: Send + 'static>(
    ctx: &mut Ctx<'_>,
    key: &Key,
    f: impl FnOnce(&mut C::Items) -> strata_engine::Result<(bool, R)> + Send,
) -> Result<R, Reply> {
    let engine = &ctx.shared.engine;
    let r = engine
        .update_live(
            key,
            C::KIND,
            // The clock is read only when a value is decoded (a live value needs none).
            |value| {
                let now = engine.now_ms();
                Ok(Box::new(LiveItems::<C, C::Items>::decode(value, now)?))
            },
            move |live| {
                let any: &mut dyn std::any::Any = live;
                let items = any
                    .downcast_mut::<LiveItems<C, C::Items>>()
                    .expect("a live value of this kind is this codec's");
                let (changed, out) = f(&mut items.items)?;
                Ok((changed, (changed, out)))
            },
        )
        .await;
    written(ctx, key, C::KIND, r)
}

/// [`write_items`] always the whole-value way (the value read, changed and stored again):
/// for changes that give items an expiry of their own, which live values do not hold.
pub(crate) async fn write_items_whole<C: Codec, R: Send + 'static>(
    ctx: &mut Ctx<'_>,
    key: &Key,
    f: impl FnOnce(&mut Vec<C::Item>) -> strata_engine::Result<(bool, R)> + Send,
) -> Result<R, Reply> {
    let now = ctx.shared.engine.now_ms();
    write_kind(ctx, key, C::KIND, move |value| {
        let mut items = match value {
            Some(v) => C::decode(v, now).map_err(|e| corrupt(C::KIND, e))?,
            None => Vec::new(),
        };
        let (changed, out) = f(&mut items)?;
        let edit = match (changed, items.is_empty()) {
            (false, _) => Edit::Keep,
            (true, true) => Edit::Delete,
            (true, false) => Edit::Put(C::encode(&items)),
        };
        Ok((edit, out))
    })
    .await
}

/// Stores `items` as the value of `C`'s kind at the client key `dst` (replacing whatever it
/// held; no items deletes it) and replies with how many were stored (the `STORE` forms).
pub(crate) async fn store_items<C: Codec>(
    ctx: &mut Ctx<'_>,
    dst: &[u8],
    items: &[C::Item],
) -> Reply {
    let value = (!items.is_empty()).then(|| C::encode(items));
    let dst = ctx.key(dst);
    reply(store_kind(ctx, &dst, C::KIND, value).await, |_| {
        Reply::Integer(items.len() as i64)
    })
}

/// The count of a pop (`SPOP`, `ZPOPMIN`, `LPOP`, ...): `key [count]`, not negative. More
/// arguments are a syntax error, or for `LPOP`/`RPOP` (as Redis has it) the wrong number.
pub(crate) fn pop_count(a: &[Bytes]) -> Result<Option<usize>, Reply> {
    use super::ctx::{lower, parse_int, syntax_error, wrong_args};
    match a.len() {
        2 => Ok(None),
        3 => match parse_int(&a[2]) {
            Some(n) if n >= 0 => Ok(Some(n as usize)),
            _ => Err(Reply::err("ERR value is out of range, must be positive")),
        },
        _ => match lower(&a[0]).as_str() {
            name @ ("lpop" | "rpop") => Err(wrong_args(name)),
            _ => Err(syntax_error()),
        },
    }
}

/// Most items one random pick with a negative count returns (`HRANDFIELD`, `SRANDMEMBER`,
/// `ZRANDMEMBER`).
const RANDOM_COUNT_MAX: u64 = 1 << 20;

/// The arguments of a random pick: `key [count [flag]]` (`flag`: `WITHVALUES`,
/// `WITHSCORES`, or none allowed).
pub(crate) fn random_args(a: &[Bytes], flag: Option<&str>) -> Result<(Option<i64>, bool), Reply> {
    use super::ctx::{lower, not_integer, parse_int, syntax_error};
    let count = match a.get(2) {
        None => None,
        Some(c) => match parse_int(c) {
            Some(n) if n.unsigned_abs() <= RANDOM_COUNT_MAX => Some(n),
            Some(_) => return Err(Reply::err("ERR value is out of range")),
            None => return Err(not_integer()),
        },
    };
    let with = match (a.get(3), flag) {
        (None, _) => false,
        (Some(o), Some(f)) if lower(o) == f && a.len() == 4 => true,
        _ => return Err(syntax_error()),
    };
    Ok((count, with))
}

/// Random positions among `len` items: `count` distinct ones in random order, or with a
/// negative count, `-count` that may repeat.
pub(crate) fn random_positions(len: usize, count: i64) -> Vec<usize> {
    if len == 0 {
        return Vec::new();
    }
    if count < 0 {
        return (0..count.unsigned_abs())
            .map(|i| (random_u64(i) % len as u64) as usize)
            .collect();
    }
    let count = (count as u64).min(len as u64) as usize;
    let below = |n: usize, salt: usize| (random_u64(salt as u64) % n as u64) as usize;
    if count.saturating_mul(4) >= len {
        let mut idx: Vec<usize> = (0..len).collect();
        for i in (1..len).rev() {
            idx.swap(i, below(i + 1, i));
        }
        idx.truncate(count);
        return idx;
    }
    if count == 1 {
        return vec![below(len, 0)];
    }
    // A few of many (`SPOP`, `SRANDMEMBER 5` of a million): Floyd's sampling, distinct
    // positions in `count` steps, then shuffled.
    let mut picked = std::collections::HashSet::with_capacity(count);
    let mut out = Vec::with_capacity(count);
    for j in len - count..len {
        let t = below(j + 1, j);
        let p = if picked.insert(t) { t } else { j };
        picked.insert(p);
        out.push(p);
    }
    for i in (1..out.len()).rev() {
        out.swap(i, below(i + 1, i));
    }
    out
}

/// A random number for the commands that pick at random (`HRANDFIELD`, `SPOP`): not for
/// anything that must be unpredictable.
pub(crate) fn random_u64(counter: u64) -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(counter)
}

/// A `*SCAN` over one value (`HSCAN`, `SSCAN`, `ZSCAN`): where it goes on from, its
/// `COUNT`, its `MATCH` pattern, and whether values are left out (`NOVALUES`).
pub(crate) struct ScanOptions {
    pub(crate) cursor: u64,
    pub(crate) count: usize,
    pub(crate) pattern: Option<Bytes>,
    pub(crate) values: bool,
}

/// `COUNT` when none is given, as in Redis.
const SCAN_COUNT_DEFAULT: usize = 10;

/// Values of up to this many items are answered in one page whatever the `COUNT` (Redis
/// does so for its compact encodings, up to 128 entries by default).
const SCAN_WHOLE_MAX: usize = 128;

/// The options of a `*SCAN` over one value; `NOVALUES` where `novalues` allows it.
pub(crate) fn scan_options(a: &[Bytes], novalues: bool) -> Result<ScanOptions, Reply> {
    use super::ctx::{lower, not_integer, parse_int, syntax_error};
    let Some(cursor) = std::str::from_utf8(&a[2])
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    else {
        return Err(Reply::err("ERR invalid cursor"));
    };
    let mut o = ScanOptions {
        cursor,
        count: SCAN_COUNT_DEFAULT,
        pattern: None,
        values: true,
    };
    let mut i = 3;
    while i < a.len() {
        match lower(&a[i]).as_str() {
            "match" if i + 1 < a.len() => {
                o.pattern = Some(a[i + 1].clone());
                i += 2;
            }
            "count" if i + 1 < a.len() => {
                o.count = match parse_int(&a[i + 1]) {
                    Some(n) if n >= 1 => n as usize,
                    Some(_) => return Err(syntax_error()),
                    None => return Err(not_integer()),
                };
                i += 2;
            }
            "novalues" if novalues => {
                o.values = false;
                i += 1;
            }
            _ => return Err(syntax_error()),
        }
    }
    Ok(o)
}

/// A walk by member hash ([`ScanOptions::hash_range`]) covers hashes `0..HASH_SPACE`: a
/// member's hash is its CRC-32C, fixed by its bytes alone.
const HASH_SPACE: u64 = 1 << 32;

/// Most pages a walk by hash takes, whatever its `COUNT` (which Redis calls a hint): each
/// page is a pass over the whole collection.
const HASH_PAGES_MAX: u64 = 64;

/// A walk by position keeps its position in a cursor's low 32 bits, and the mark of the
/// item there in the high ones ([`ScanOptions::page`]).
const WALK_POSITION_MASK: u64 = (1 << 32) - 1;

/// The mark a walk by position keeps of the item it stopped at: 31 bits of its name's
/// hash (a cursor stays a positive 64-bit integer).
fn walk_mark(name: &[u8]) -> u64 {
    member_hash(name) & 0x7fff_ffff
}

/// A member's place in a walk by hash ([`ScanOptions::hash_range`]).
pub(crate) fn member_hash(member: &[u8]) -> u64 {
    u64::from(crc32c::crc32c(member))
}

impl ScanOptions {
    /// The range of member hashes ([`member_hash`]) this scan of a collection of `len`
    /// items answers with, and the cursor to go on with (0: the walk is over): for a
    /// collection kept in an order its changes rearrange (a sorted set, by score), where a
    /// walk by position could miss a member. The ranges of a walk follow each other from 0
    /// to [`HASH_SPACE`], each about `count` members wide (at most [`HASH_PAGES_MAX`]
    /// pages), so a member held from a walk's first page to its last is on exactly one of
    /// them whatever moves meanwhile, even if its key is rewritten whole. A value of up to
    /// [`SCAN_WHOLE_MAX`] items is one page.
    pub(crate) fn hash_range(&self, len: usize) -> (std::ops::Range<u64>, u64) {
        if len <= SCAN_WHOLE_MAX {
            return (0..HASH_SPACE, 0);
        }
        let len = len as u64;
        let per_page = (self.count as u64).max(len.div_ceil(HASH_PAGES_MAX));
        let width = HASH_SPACE.div_ceil(len.div_ceil(per_page));
        let start = self.cursor.min(HASH_SPACE);
        let end = start.saturating_add(width).min(HASH_SPACE);
        (start..end, if end == HASH_SPACE { 0 } else { end })
    }

    /// The page of `items` this scan answers with, and the cursor to go on with (0: the
    /// walk is over); `name` gives an item's name. A value of up to [`SCAN_WHOLE_MAX`]
    /// items is one page; a larger one is walked by position, about `count` at a time,
    /// last first. Items join a collection at its end and a removal moves none to a later
    /// position ([`Indexed::remove`]), so an item held from a walk's first page to its last
    /// is on one of them, as Redis promises; one may come twice. A cursor also carries a
    /// mark of the item it stopped at ([`walk_mark`]): if that item is no longer there, the
    /// value was rewritten whole meanwhile (a `STORE` form onto its key, `RESTORE`,
    /// `RENAME`) or that item moved, and the walk starts over from the end, so nothing held
    /// throughout is missed.
    pub(crate) fn page<'i, T>(&self, items: &'i [T], name: impl Fn(&T) -> &[u8]) -> (&'i [T], u64) {
        let (range, next) = self.page_of(items.len(), |i| name(&items[i]));
        (&items[range], next)
    }

    /// [`ScanOptions::page`] of a collection of `len` items whose name at each position
    /// `name` gives: the positions of the page.
    pub(crate) fn page_of<'n>(
        &self,
        len: usize,
        name: impl Fn(usize) -> &'n [u8],
    ) -> (std::ops::Range<usize>, u64) {
        if len <= SCAN_WHOLE_MAX {
            return (0..len, 0);
        }
        let (at, mark) = (self.cursor & WALK_POSITION_MASK, self.cursor >> 32);
        let at = usize::try_from(at).unwrap_or(usize::MAX);
        let end = if self.cursor == 0 || (at < len && walk_mark(name(at)) != mark) {
            len
        } else {
            at.min(len)
        };
        let start = end.saturating_sub(self.count);
        let next = match start {
            0 => 0,
            s => walk_mark(name(s)) << 32 | s as u64,
        };
        (start..end, next)
    }

    /// Whether `name` passes the `MATCH` pattern.
    pub(crate) fn matches(&self, name: &[u8]) -> bool {
        matches(&self.pattern, name)
    }
}

/// A `*SCAN` reply: a page of items and the cursor that goes on from it.
pub(crate) fn scan_reply(cursor: u64, items: Vec<Reply>) -> Reply {
    Reply::Array(vec![
        Reply::bulk(Bytes::from(cursor.to_string())),
        Reply::Array(items),
    ])
}

/// Whether `name` passes a `MATCH` pattern.
pub(crate) fn matches(pattern: &Option<Bytes>, name: &[u8]) -> bool {
    pattern
        .as_ref()
        .is_none_or(|p| strata_engine::glob::glob_match(p, name))
}

/// A blocking command's timeout in seconds (a float; 0 waits for ever).
pub(crate) fn parse_timeout(b: &[u8]) -> Result<Option<Duration>, Reply> {
    let s = std::str::from_utf8(b).ok();
    let t: f64 = match s.and_then(|s| s.parse().ok()) {
        Some(t) if f64::is_finite(t) => t,
        _ => return Err(Reply::err("ERR timeout is not a float or out of range")),
    };
    if t < 0.0 {
        return Err(Reply::err("ERR timeout is negative"));
    }
    Ok((t > 0.0).then(|| Duration::from_secs_f64(t)))
}

/// Runs `attempt` until it gives a reply, waiting between attempts for a change to one of
/// the client's `keys` (served in the order clients blocked: [`crate::blocked`]; once
/// woken, commands on `holds`, the keys it writes besides, wait for its try), until
/// `timeout` or the client leaves; then `on_timeout`. Outside a blocking context (inside
/// `MULTI`) it tries once. Each attempt holds the server's gate (for writing when
/// `exclusive`: the moves), so it never runs inside another client's transaction.
pub(crate) async fn block_on<F>(
    ctx: &mut Ctx<'_>,
    keys: &[Bytes],
    holds: &[Bytes],
    timeout: Option<Duration>,
    exclusive: bool,
    on_timeout: Reply,
    mut attempt: F,
) -> Reply
where
    F: for<'c, 'd> FnMut(
        &'c mut Ctx<'d>,
    ) -> futures::future::BoxFuture<'c, Result<Option<Reply>, Reply>>,
{
    if !ctx.conn.may_block {
        // Inside MULTI: one attempt.
        return match attempt(ctx).await {
            Ok(Some(r)) | Err(r) => r,
            Ok(None) => on_timeout,
        };
    }
    use std::sync::atomic::Ordering::Relaxed;
    let shared = std::sync::Arc::clone(ctx.shared);
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let mut shutdown = shared.shutdown.subscribe();
    let unblock = std::sync::Arc::clone(&ctx.conn.unblock);
    // A wake left by a command that ended before it was used is not for this one.
    use futures::FutureExt;
    let _ = unblock.notify.notified().now_or_never();
    unblock.as_error.store(false, Relaxed);
    // Queued before the first attempt: a change between an attempt and the wait below
    // leaves a permit, so it is not missed.
    let stored = |ctx: &Ctx<'_>, keys: &[Bytes]| keys.iter().map(|k| ctx.key(k)).collect();
    let mut place = shared.blocked.join(stored(ctx, keys), stored(ctx, holds));
    let until_deadline = || async move {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    // How the wait ends when no change woke it.
    let ended = |unblock: &crate::blocked::Unblock, on_timeout: Reply| {
        if unblock.as_error.load(Relaxed) {
            Reply::err("UNBLOCKED client unblocked via CLIENT UNBLOCK")
        } else {
            on_timeout
        }
    };
    // Clients queued before this one and woken for its keys try first. Meanwhile the
    // client is blocked: the wait ends as the one below does, but past the deadline the
    // first try still comes (it may find what the client waits for).
    unblock.waiting.store(true, Relaxed);
    let ended_early = tokio::select! {
        _ = shared.blocked.turn(&place) => false,
        _ = until_deadline() => false,
        _ = shutdown.changed() => true,
        _ = unblock.notify.notified() => true,
    };
    unblock.waiting.store(false, Relaxed);
    if ended_early {
        return ended(&unblock, on_timeout);
    }
    let mut first = true;
    loop {
        if place.stale() {
            place.rekey(stored(ctx, keys), stored(ctx, holds));
        }
        place.trying();
        // In a cluster, each attempt checks again that the keys' slot is served here (it
        // may have started moving while the client waited).
        let rerouted = || {
            let c = shared.cluster.as_ref()?;
            let slot = strata_format::keys::slot_of(keys.first()?);
            super::cluster::route_reply(c, slot, true, false)
        };
        let got = {
            let (_w, _r);
            if exclusive {
                _w = shared.gate.write().await;
            } else {
                _r = shared.gate.read().await;
            }
            match rerouted() {
                Some(r) => Err(r),
                None => attempt(ctx).await,
            }
        };
        match got {
            // As Redis: a key that became another kind while the client waited does not
            // wake it with an error; it waits on.
            Err(Reply::Error(e)) if !first && e.starts_with("WRONGTYPE") => {}
            Err(r) | Ok(Some(r)) => return r,
            Ok(None) => {}
        }
        place.tried();
        first = false;
        unblock.waiting.store(true, Relaxed);
        let woken = tokio::select! {
            _ = place.wake.notified() => true,
            _ = until_deadline() => false,
            _ = shutdown.changed() => false,
            // The client left (it is no longer in line; its reply goes nowhere), or
            // `CLIENT UNBLOCK`.
            _ = unblock.notify.notified() => false,
        };
        unblock.waiting.store(false, Relaxed);
        if !woken {
            return ended(&unblock, on_timeout);
        }
    }
}

/// The arguments of a `BLMPOP`/`BZMPOP`: the timeout (argument 1), then [`mpop_args`]
/// from `numkeys` (argument 2).
pub(crate) fn blocking_mpop_args(
    a: &[Bytes],
    ends: [&str; 2],
) -> Result<(Option<Duration>, Vec<Bytes>, bool, usize), Reply> {
    let timeout = parse_timeout(&a[1])?;
    let (keys, first, count) = mpop_args(a, 2, ends)?;
    Ok((timeout, keys, first, count))
}

/// The arguments of an `LMPOP`/`ZMPOP` (from `numkeys` at `at`): the keys, which end
/// (`ends`: `LEFT`/`RIGHT` or `MIN`/`MAX`; true for the first), and `COUNT` (1 if absent).
pub(crate) fn mpop_args(
    a: &[Bytes],
    at: usize,
    ends: [&str; 2],
) -> Result<(Vec<Bytes>, bool, usize), Reply> {
    use super::ctx::{lower, parse_int, syntax_error};
    let n = match parse_int(&a[at]) {
        Some(n) if n > 0 => n as usize,
        _ => return Err(Reply::err("ERR numkeys should be greater than 0")),
    };
    let where_at = at + 1 + n;
    if where_at >= a.len() {
        return Err(syntax_error());
    }
    let first = match lower(&a[where_at]) {
        w if w == ends[0] => true,
        w if w == ends[1] => false,
        _ => return Err(syntax_error()),
    };
    let count = match &a[where_at + 1..] {
        [] => 1,
        [opt, c] if lower(opt) == "count" => match parse_int(c) {
            Some(c) if c > 0 => c as usize,
            _ => return Err(Reply::err("ERR count should be greater than 0")),
        },
        _ => return Err(syntax_error()),
    };
    Ok((a[at + 1..where_at].to_vec(), first, count))
}

/// The arguments of `BLPOP`, `BZPOPMIN` and the like: `key [key ...] timeout`.
pub(crate) fn keys_then_timeout(a: &[Bytes]) -> Result<(Vec<Bytes>, Option<Duration>), Reply> {
    let timeout = parse_timeout(&a[a.len() - 1])?;
    Ok((a[1..a.len() - 1].to_vec(), timeout))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cmd::items::next_random;
    use std::collections::HashSet;

    #[test]
    fn random_positions_are_distinct_in_range_and_even() {
        for (len, count) in [(1000, 5), (1000, 300), (1000, 900), (10, 20), (1, 1)] {
            let p = random_positions(len, count);
            assert_eq!(p.len(), (count as usize).min(len));
            assert!(p.iter().all(|&i| i < len));
            assert_eq!(p.iter().collect::<HashSet<_>>().len(), p.len(), "distinct");
        }
        // A few of many, as SPOP and SRANDMEMBER take them: every position as likely.
        let mut hits = [0u32; 20];
        for _ in 0..20_000 {
            for i in random_positions(20, 2) {
                hits[i] += 1;
            }
        }
        assert!(hits.iter().all(|&h| (1600..2400).contains(&h)), "{hits:?}");
        assert_eq!(
            random_positions(5, -8).len(),
            8,
            "a negative count may repeat"
        );
    }

    /// A scan's options with no pattern.
    fn scan_opts(cursor: u64, count: usize) -> ScanOptions {
        ScanOptions {
            cursor,
            count,
            pattern: None,
            values: true,
        }
    }

    #[test]
    fn a_scan_walk_meets_every_member_held_throughout_while_others_come_and_go() {
        let name = |i: u64| Bytes::from(format!("m{i}"));
        let mut set: Indexed<MemberPack> = Items::from_vec((0..1000).map(name).collect());
        set.position(b"m1");
        let held: HashSet<Bytes> = (0..1000).filter(|i| i % 3 != 0).map(name).collect();
        let (mut x, mut cursor, mut seen, mut pages) = (5u64, 0u64, HashSet::new(), 0);
        let mut next_name = 1000;
        loop {
            let count = 1 + (x % 40) as usize;
            let (page, next) = scan_opts(cursor, count).page_of(set.len(), |i| set.get(i));
            assert!(page.len() <= count, "a page holds at most COUNT");
            seen.extend(page.map(|i| Bytes::copy_from_slice(set.get(i))));
            pages += 1;
            // Between pages: members not held throughout leave, new ones come.
            for _ in 0..20 {
                x = next_random(x);
                let m = name((x >> 33) % 1000);
                if !held.contains(&m) {
                    set.remove_named([&m[..]]);
                }
                set.push(&name(next_name)).unwrap();
                next_name += 1;
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        assert!(pages > 20, "{pages} pages");
        let missed: Vec<&Bytes> = held.difference(&seen).collect();
        assert!(missed.is_empty(), "missed {missed:?}");
        // A value of a few items comes whole, with the walk's end.
        let small: Vec<Bytes> = (0..SCAN_WHOLE_MAX as u64).map(name).collect();
        assert_eq!(scan_opts(0, 1).page(&small, |m| m), (&small[..], 0));
    }

    #[test]
    fn a_walk_by_position_starts_over_when_its_value_is_rewritten_whole() {
        let name = |i: u64| Bytes::from(format!("m{i}"));
        let all: Vec<Bytes> = (0..1000).map(name).collect();
        let mut items = all.clone();
        let (mut cursor, mut seen, mut x) = (0u64, HashSet::new(), 9u64);
        for page_no in 0.. {
            let (page, next) = scan_opts(cursor, 50).page(&items, |m| m);
            seen.extend(page.iter().cloned());
            if next == 0 {
                break;
            }
            if page_no == 5 {
                // The key is rewritten whole with the same members in another order.
                for i in (1..items.len()).rev() {
                    x = next_random(x);
                    items.swap(i, (x >> 33) as usize % (i + 1));
                }
            }
            cursor = next;
        }
        let missed: Vec<&Bytes> = all.iter().filter(|m| !seen.contains(*m)).collect();
        assert!(missed.is_empty(), "missed {} members", missed.len());
        // A cursor from before the marks (a bare position) starts over too.
        let (page, _) = scan_opts(500, 10).page(&all, |m| m);
        assert_eq!(page, &all[990..]);
    }

    #[test]
    fn a_walk_by_hash_meets_every_member_held_throughout_exactly_once() {
        let name = |i: u64| Bytes::from(format!("m{i}"));
        let mut members: Vec<Bytes> = (0..5000).map(name).collect();
        let held: HashSet<Bytes> = (0..5000).filter(|i| i % 3 != 0).map(name).collect();
        let (mut x, mut cursor, mut pages) = (7u64, 0u64, 0);
        let mut seen: Vec<Bytes> = Vec::new();
        let mut next_name = 5000;
        loop {
            let count = 1 + (x % 200) as usize;
            let (range, next) = scan_opts(cursor, count).hash_range(members.len());
            assert_eq!(range.start, cursor);
            seen.extend(
                members
                    .iter()
                    .filter(|m| range.contains(&member_hash(m)))
                    .cloned(),
            );
            pages += 1;
            // Between pages: members not held throughout leave, new ones come, and the
            // order is shuffled (a sorted set's scores change).
            for _ in 0..50 {
                x = next_random(x);
                let m = name((x >> 33) % 5000);
                if !held.contains(&m) {
                    members.retain(|n| n != &m);
                }
                members.push(name(next_name));
                next_name += 1;
            }
            members.rotate_left((x % 97) as usize);
            if next == 0 {
                break;
            }
            assert!(next > cursor, "the walk moves on");
            cursor = next;
        }
        assert!(pages > 20 && pages <= 64, "{pages} pages");
        for m in &held {
            let times = seen.iter().filter(|s| *s == m).count();
            assert_eq!(times, 1, "{m:?} seen {times} times");
        }
        // A walk past the end (a cursor no walk hands out) is over.
        assert_eq!(
            scan_opts(HASH_SPACE + 5, 10).hash_range(1000),
            (HASH_SPACE..HASH_SPACE, 0)
        );
        // A few items come whole, with the walk's end.
        assert_eq!(
            scan_opts(99, 1).hash_range(SCAN_WHOLE_MAX),
            (0..HASH_SPACE, 0)
        );
    }

    /// A stored value kept up to date by the deltas taken from the items (or by their
    /// whole value when they give none), checked against the items' value each time: what
    /// a replay of the hot log does.
    struct DeltaCheck {
        kind: Kind,
        encode: fn(&[Bytes]) -> Vec<u8>,
        stored: Vec<u8>,
        deltas: u32,
        wholes: u32,
    }

    impl DeltaCheck {
        fn new<T: Items<Bytes>>(
            items: &mut T,
            kind: Kind,
            encode: fn(&[Bytes]) -> Vec<u8>,
        ) -> Self {
            let stored = items.encode_with(encode);
            items.stored();
            DeltaCheck {
                kind,
                encode,
                stored,
                deltas: 0,
                wholes: 0,
            }
        }

        /// What is compared: a set's members in sorted order, a list's elements as stored.
        fn sorted(&self, value: &[u8]) -> Vec<Vec<u8>> {
            let mut items: Vec<Vec<u8>> = strata_format::members::decode_members(value)
                .unwrap()
                .into_iter()
                .map(<[u8]>::to_vec)
                .collect();
            if self.kind == Kind::Set {
                items.sort_unstable();
            }
            items
        }

        /// Taken every few changes, now and then after many (past the note's limit).
        fn at<T: Items<Bytes>>(&mut self, items: &mut T, step: u64) {
            if (step < 10_000 && step.is_multiple_of(7)) || step % 1000 == 999 {
                let whole = items.encode_with(self.encode);
                self.stored = match items.delta(self.encode) {
                    Some(d) => {
                        self.deltas += 1;
                        strata_format::delta::apply(self.kind, &self.stored, &[&d]).unwrap()
                    }
                    None => {
                        self.wholes += 1;
                        whole.clone()
                    }
                };
                // A large set's removals move its last member into the gap, which a
                // replay does not repeat: the same members, maybe in another order.
                assert_eq!(
                    self.sorted(&self.stored),
                    self.sorted(&whole),
                    "step {step}"
                );
            }
        }
    }

    #[test]
    fn a_sets_noted_changes_applied_to_its_stored_value_give_its_value_now() {
        let name = |i: u64| Bytes::from(format!("m{i}"));
        let mut set: Indexed<MemberPack> = Items::from_vec((0..400).map(name).collect());
        let mut check = DeltaCheck::new(&mut set, Kind::Set, SetCodec::encode);
        let mut x = 7u64;
        for step in 0..20_000u64 {
            x = next_random(x);
            let m = name((x >> 33) % 600);
            match (x >> 20) % 4 {
                0 => {
                    set.remove_named([&m[..]]);
                }
                1 if set.len() > 0 => {
                    set.remove(((x >> 40) as usize) % set.len());
                }
                _ => {
                    if !set.contains(&m) {
                        set.push(&m).unwrap();
                    }
                }
            }
            check.at(&mut set, step);
        }
        let (deltas, wholes) = (check.deltas, check.wholes);
        assert!(
            deltas > 1000 && wholes > 0,
            "{deltas} deltas, {wholes} whole"
        );
    }

    #[test]
    fn a_lists_noted_changes_applied_to_its_stored_value_give_its_value_now() {
        let mut list: Deque =
            Items::from_vec((0..300u64).map(|i| Bytes::from(i.to_string())).collect());
        let mut check = DeltaCheck::new(&mut list, Kind::List, ListCodec::encode);
        let mut x = 3u64;
        for step in 0..20_000u64 {
            x = next_random(x);
            let e = Bytes::from(format!("e{step}"));
            let n = ((x >> 50) % 3) as usize;
            match (x >> 20) % 9 {
                0 => list.push_front(&e),
                1 | 2 => list.push_back(&e),
                3 => drop(list.take_front(n)),
                4 => drop(list.take_back(n)),
                5 if !list.is_empty() => {
                    let i = ((x >> 33) as usize) % list.len();
                    list.set(i, &e);
                }
                6 if step % 50 == 0 => list.whole_mut().insert(0, e),
                // LINSERT: anywhere, the end too.
                7 => {
                    let i = ((x >> 33) as usize) % (list.len() + 1);
                    list.insert(i, &e);
                }
                // LREM: a few elements spread over the list.
                8 => {
                    let keep: Vec<bool> = (0..list.len())
                        .map(|i| !(i + (x >> 40) as usize).is_multiple_of(97))
                        .collect();
                    list.remove_flagged(&keep);
                }
                _ => {}
            }
            check.at(&mut list, step);
        }
        let (deltas, wholes) = (check.deltas, check.wholes);
        assert!(
            deltas > 1000 && wholes > 5,
            "{deltas} deltas, {wholes} whole"
        );
    }

    #[test]
    fn a_list_logs_a_delta_until_a_commit_changes_as_many_as_it_holds() {
        let mut list: Deque =
            Items::from_vec((0..1000u64).map(|i| Bytes::from(i.to_string())).collect());
        for i in 0..600 {
            list.push_back(format!("n{i}").as_bytes());
        }
        assert!(
            Items::delta(&mut list, ListCodec::encode).is_some(),
            "600 pushes onto 1,000 elements: a delta"
        );
        // Popped one at a time from 1,600: past the 800th pop the changes outnumber what
        // is left.
        for _ in 0..900 {
            drop(list.take_front(1));
        }
        assert!(Items::delta(&mut list, ListCodec::encode).is_none());
        assert!(
            Items::delta(&mut list, ListCodec::encode).is_some(),
            "a new delta starts"
        );
    }

    #[test]
    fn a_list_encodes_in_order_across_its_blocks() {
        let mut l: Deque =
            Items::from_vec((0..600).map(|i| Bytes::from(format!("e{i}"))).collect());
        for i in 0..300 {
            l.push_front(format!("f{i}").as_bytes());
        }
        let want: Vec<Bytes> = l.iter().cloned().collect();
        assert_eq!(want.len(), 900);
        assert_eq!(
            (&want[0], &want[299], &want[300]),
            (&Bytes::from("f299"), &Bytes::from("f0"), &Bytes::from("e0"))
        );
        assert_eq!(l.encode_with(ListCodec::encode), ListCodec::encode(&want));
    }
}
