//! Communicators, processes and groups.

use std::any::TypeId;
use std::collections::HashMap;

use crate::attribute::{AttrEntry, CommAttribute};
use crate::datatype::traits::*;
use crate::{iidx, ok, uidx, Count, Tag};

/// The traits of this module that `mpi::traits::*` brings in.
pub mod traits {
    pub use super::{AnyCommunicator, AsCommunicator, Communicator, Group};
}

/// A rank (rsmpi's `c_int`).
pub type Rank = std::os::raw::c_int;
/// A key ordering ranks in a split.
pub type Key = std::os::raw::c_int;

/// What a communicator is made of: tmpi's communicator and what rsmpi keeps beside it.
#[doc(hidden)]
pub struct CommHandle {
    pub(crate) comm: tmpi::Comm,
    attrs: HashMap<TypeId, Box<dyn AttrEntry>>,
    pub(crate) cart: Option<tmpi::CartComm>,
}

impl CommHandle {
    pub(crate) fn new(comm: tmpi::Comm) -> CommHandle {
        CommHandle { comm, attrs: HashMap::new(), cart: None }
    }
}

pub(crate) mod sealed {
    /// Access to the communicator behind a handle-like value.
    pub trait AsHandle {
        /// The communicator.
        fn as_handle(&self) -> &super::CommHandle;
        /// The communicator, for changes (attributes); `None` for borrowed views.
        fn as_handle_mut(&mut self) -> Option<&mut super::CommHandle> {
            None
        }
    }
}

/// Something that has a communicator.
pub trait AsCommunicator {
    /// The communicator's type.
    type Out: Communicator;
    /// The communicator.
    fn as_communicator(&self) -> &Self::Out;
}

/// A communicator of ranks in one group.
pub struct SimpleCommunicator(pub(crate) CommHandle);

impl SimpleCommunicator {
    /// The world communicator (`MPI_COMM_WORLD`).
    pub fn world() -> SimpleCommunicator {
        SimpleCommunicator(CommHandle::new(crate::state::world_comm("SimpleCommunicator::world")))
    }

    /// A communicator of this process alone (`MPI_COMM_SELF`).
    pub fn self_comm() -> SimpleCommunicator {
        let w = crate::state::world_comm("SimpleCommunicator::self_comm");
        let c = ok(w.split(Some(w.rank() as u32), 0), "SimpleCommunicator::self_comm");
        let c = c.expect("a split with a color returns a communicator");
        c.set_name("MPI_COMM_SELF");
        SimpleCommunicator(CommHandle::new(c))
    }

    pub(crate) fn from_tmpi(comm: tmpi::Comm) -> SimpleCommunicator {
        SimpleCommunicator(CommHandle::new(comm))
    }

    pub(crate) fn handle_size(&self) -> usize {
        self.0.comm.size()
    }

    /// The topology of the communicator.
    pub fn topology(&self) -> Topology {
        if self.0.cart.is_some() {
            Topology::Cartesian
        } else {
            Topology::Undefined
        }
    }

    /// The communicator as its topology kind.
    pub fn into_topology(self) -> IntoTopology {
        if self.0.cart.is_some() {
            IntoTopology::Cartesian(CartesianCommunicator(self))
        } else {
            IntoTopology::Undefined(self)
        }
    }
}

impl sealed::AsHandle for SimpleCommunicator {
    fn as_handle(&self) -> &CommHandle {
        &self.0
    }
    fn as_handle_mut(&mut self) -> Option<&mut CommHandle> {
        Some(&mut self.0)
    }
}
impl Communicator for SimpleCommunicator {}
impl AsCommunicator for SimpleCommunicator {
    type Out = SimpleCommunicator;
    fn as_communicator(&self) -> &Self::Out {
        self
    }
}

/// The topology attached to a communicator.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Topology {
    /// A graph.
    Graph,
    /// A Cartesian grid.
    Cartesian,
    /// A distributed graph.
    DistributedGraph,
    /// None.
    Undefined,
}

/// A communicator sorted by its topology.
pub enum IntoTopology {
    /// A graph.
    Graph(GraphCommunicator),
    /// A Cartesian grid.
    Cartesian(CartesianCommunicator),
    /// A distributed graph.
    DistributedGraph(DistributedGraphCommunicator),
    /// No topology.
    Undefined(SimpleCommunicator),
}

/// A graph communicator (never produced: tmpi has no graph topology).
#[derive(Debug)]
pub struct GraphCommunicator;
/// A distributed graph communicator (never produced by this version).
#[derive(Debug)]
pub struct DistributedGraphCommunicator;

/// An intercommunicator (from [`crate::collective::Root::spawn`] or
/// [`Communicator::parent`]): point-to-point calls through it address the remote group.
pub struct InterCommunicator(pub(crate) CommHandle, pub(crate) tmpi::InterComm);

impl InterCommunicator {
    pub(crate) fn new(ic: tmpi::InterComm) -> InterCommunicator {
        InterCommunicator(CommHandle::new(ic.remote_view().clone()), ic)
    }
    /// The size of the remote group.
    pub fn remote_size(&self) -> Rank {
        iidx(self.1.remote_size())
    }
    /// The remote group.
    pub fn remote_group(&self) -> UserGroup {
        UserGroup(self.1.remote_group())
    }
    /// Merges both groups into one intracommunicator (`Low`: this group first).
    pub fn merge(&self, order: MergeOrder) -> SimpleCommunicator {
        SimpleCommunicator::from_tmpi(ok(self.1.merge(matches!(order, MergeOrder::High)), "merge"))
    }
}
impl sealed::AsHandle for InterCommunicator {
    fn as_handle(&self) -> &CommHandle {
        &self.0
    }
}
impl Communicator for InterCommunicator {}
impl AsCommunicator for InterCommunicator {
    type Out = InterCommunicator;
    fn as_communicator(&self) -> &Self::Out {
        self
    }
}

/// A color for [`Communicator::split_by_color`].
#[derive(Copy, Clone, Debug)]
pub struct Color(Option<u32>);

impl Color {
    /// Not in any of the new communicators.
    pub fn undefined() -> Color {
        Color(None)
    }
    /// A color; ranks with equal colors share a new communicator.
    pub fn with_value(value: std::os::raw::c_int) -> Color {
        Color(Some(u32::try_from(value).unwrap_or_else(|_| panic!("mpi: Color::with_value: a color must be non-negative, got {value}"))))
    }
}

/// How two communicators relate.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum CommunicatorRelation {
    /// The same communicator.
    Identical,
    /// Same members, same order, different contexts.
    Congruent,
    /// Same members, another order.
    Similar,
    /// Different members.
    Unequal,
}

/// How two groups relate.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum GroupRelation {
    /// Same members, same order.
    Identical,
    /// Same members, another order.
    Similar,
    /// Different members.
    Unequal,
}

/// Which group comes first in [`InterCommunicator::merge`].
#[derive(Copy, Clone, Debug)]
pub enum MergeOrder {
    /// This group first.
    Low,
    /// This group last.
    High,
}

fn to_u32(c: Count, call: &str) -> usize {
    uidx(c, call)
}

/// A communicator: the operations every communicator (and process handle) has.
pub trait Communicator: sealed::AsHandle {
    /// The size of the group messages go to (the remote group for an intercommunicator).
    fn target_size(&self) -> Rank {
        self.size()
    }

    /// The number of processes.
    fn size(&self) -> Rank {
        iidx(self.as_handle().comm.size())
    }

    /// This process's rank.
    fn rank(&self) -> Rank {
        iidx(self.as_handle().comm.rank())
    }

    /// The process at rank `r`.
    fn process_at_rank(&self, r: Rank) -> Process<'_> {
        assert!(r >= 0 && r < self.size(), "mpi: process_at_rank: rank {r} is not in a communicator of {}", self.size());
        Process { handle: self.as_handle(), rank: r }
    }

    /// Any process (a source that matches every rank).
    fn any_process(&self) -> AnyProcess<'_> {
        AnyProcess(self.as_handle())
    }

    /// This process.
    fn this_process(&self) -> Process<'_> {
        Process { handle: self.as_handle(), rank: self.rank() }
    }

    /// How this communicator relates to another.
    fn compare(&self, other: &dyn Communicator) -> CommunicatorRelation {
        match self.as_handle().comm.compare(&other.as_handle().comm) {
            tmpi::CommCmp::Identical => CommunicatorRelation::Identical,
            tmpi::CommCmp::Congruent => CommunicatorRelation::Congruent,
            tmpi::CommCmp::Similar => CommunicatorRelation::Similar,
            _ => CommunicatorRelation::Unequal,
        }
    }

    /// A new communicator with the same group (`MPI_Comm_dup`); attributes whose type says
    /// `CLONE_ON_DUP` are cloned onto it.
    fn duplicate(&self) -> SimpleCommunicator {
        let h = self.as_handle();
        let mut n = SimpleCommunicator::from_tmpi(ok(h.comm.dup(), "duplicate"));
        for (k, v) in &h.attrs {
            if let Some(c) = v.dup_entry() {
                n.0.attrs.insert(*k, c);
            }
        }
        n
    }

    /// Splits by color (collective).
    fn split_by_color(&self, color: Color) -> Option<SimpleCommunicator> {
        self.split_by_color_with_key(color, 0)
    }

    /// Splits by color, ordering by key then old rank (collective).
    fn split_by_color_with_key(&self, color: Color, key: Key) -> Option<SimpleCommunicator> {
        ok(self.as_handle().comm.split(color.0, key), "split_by_color").map(SimpleCommunicator::from_tmpi)
    }

    /// Splits into the ranks that share memory (collective).
    fn split_shared(&self, key: std::os::raw::c_int) -> SimpleCommunicator {
        SimpleCommunicator::from_tmpi(ok(self.as_handle().comm.split_type(tmpi::SplitType::Shared, key), "split_shared"))
    }

    /// A communicator for the members of `group` (collective over this communicator; each
    /// rank passes the group it belongs to, or one it is not a member of, e.g. the empty
    /// group; the groups passed are disjoint or equal). `None` on ranks outside their group.
    fn split_by_subgroup_collective(&self, group: &dyn Group) -> Option<SimpleCommunicator> {
        let c = ok(self.as_handle().comm.create(&group.tgroup()), "split_by_subgroup_collective")?;
        Some(SimpleCommunicator::from_tmpi(c))
    }

    /// A communicator for the members of `group`, called by its members only (MPI's
    /// `Comm_create_group`). `None`, without communicating, on a process outside `group`.
    fn split_by_subgroup(&self, group: &dyn Group) -> Option<SimpleCommunicator> {
        self.split_by_subgroup_with_tag(group, 0)
    }

    /// As [`Communicator::split_by_subgroup`] with a tag telling concurrent calls apart
    /// (panics, naming the call, on a negative tag or one above tmpi's `TAG_UB`).
    fn split_by_subgroup_with_tag(&self, group: &dyn Group, tag: Tag) -> Option<SimpleCommunicator> {
        let g = group.tgroup();
        g.rank()?;
        let tag = tmpi::Tag::try_from(tag).unwrap_or_else(|_| panic!("mpi: split_by_subgroup_with_tag: tag {tag} is negative"));
        let c = ok(self.as_handle().comm.create_group(&g, tag), "split_by_subgroup_with_tag");
        Some(SimpleCommunicator::from_tmpi(c))
    }

    /// The group of the communicator.
    fn group(&self) -> UserGroup {
        UserGroup(self.as_handle().comm.group())
    }

    /// Ends the whole job with `errorcode`.
    fn abort(&self, errorcode: std::os::raw::c_int) -> ! {
        crate::state::abort(errorcode)
    }

    /// Whether this is an intercommunicator (never: none exist in this version).
    fn test_inter(&self) -> bool {
        false
    }

    /// Names the communicator.
    fn set_name(&self, name: &str) {
        self.as_handle().comm.set_name(name);
    }

    /// The communicator's name.
    fn get_name(&self) -> String {
        self.as_handle().comm.name()
    }

    /// A communicator with a Cartesian grid (collective); `None` on ranks outside the grid.
    fn create_cartesian_communicator(&self, dims: &[Count], periods: &[bool], reorder: bool) -> Option<CartesianCommunicator> {
        let d: Vec<usize> = dims.iter().map(|&x| to_u32(x, "create_cartesian_communicator")).collect();
        let cart = ok(self.as_handle().comm.cart_create(&d, periods, reorder), "create_cartesian_communicator")?;
        let mut h = CommHandle::new(cart.comm().clone());
        h.cart = Some(cart);
        Some(CartesianCommunicator(SimpleCommunicator(h)))
    }

    /// The rank this process would have in a Cartesian grid (`MPI_Cart_map`); `None` outside.
    fn cartesian_map(&self, dims: &[Count], periods: &[bool]) -> Option<Rank> {
        let d: Vec<usize> = dims.iter().map(|&x| to_u32(x, "cartesian_map")).collect();
        ok(self.as_handle().comm.cart_map(&d, periods), "cartesian_map").map(iidx)
    }

    /// Bytes [`Communicator::pack`] needs for `incount` elements of `datatype`.
    fn pack_size<Dt: Datatype>(&self, incount: Count, datatype: &Dt) -> Count
    where
        Self: Sized,
    {
        iidx(uidx(incount, "pack_size") * datatype.type_desc().size())
    }

    /// The packed bytes of a buffer.
    fn pack<Buf: ?Sized + Buffer>(&self, inbuf: &Buf) -> Vec<u8>
    where
        Self: Sized,
    {
        crate::bytes::send_bytes(inbuf, |b| b.to_vec())
    }

    /// Packs a buffer into `outbuf` at `position`; returns the position after it.
    fn pack_into<Buf: ?Sized + Buffer>(&self, inbuf: &Buf, outbuf: &mut [u8], position: Count) -> Count
    where
        Self: Sized,
    {
        let p = uidx(position, "pack_into");
        crate::bytes::send_bytes(inbuf, |b| {
            let dst = outbuf.get_mut(p..p + b.len()).unwrap_or_else(|| panic!("mpi: pack_into: {} bytes do not fit at {p}", b.len()));
            dst.copy_from_slice(b);
            iidx(p + b.len())
        })
    }

    /// Unpacks bytes at `position` of `inbuf` into `outbuf`; returns the position after them.
    ///
    /// # Safety
    /// `inbuf` must hold packed elements of `outbuf`'s datatype.
    unsafe fn unpack_into<Buf: ?Sized + BufferMut>(&self, inbuf: &[u8], outbuf: &mut Buf, position: Count) -> Count
    where
        Self: Sized,
    {
        let p = uidx(position, "unpack_into");
        let dt = outbuf.as_datatype();
        let d = dt.type_desc();
        let n = uidx(outbuf.count(), "unpack_into") * d.size();
        let src = inbuf.get(p..p + n).unwrap_or_else(|| panic!("mpi: unpack_into: {n} bytes are not there at {p}"));
        // SAFETY: `outbuf` describes `count` writable elements of its datatype.
        unsafe { crate::datatype::pack::unpack(src, outbuf.pointer_mut() as *mut u8, n / d.size().max(1), d, "unpack_into") };
        iidx(p + n)
    }

    /// The intercommunicator to the parents of this process, if a spawn started it.
    fn parent(&self) -> Option<InterCommunicator> {
        tmpi::parent().map(InterCommunicator::new)
    }
}

/// Typed attributes of a communicator.
pub trait AnyCommunicator: Communicator {
    /// The attribute of type `A`, if set.
    fn get_attr<A: CommAttribute>(&self) -> Option<&A>;
    /// Sets the attribute of type `A` (dropping a previous one).
    fn set_attr<A: CommAttribute>(&mut self, val: A);
}

impl<C: ?Sized + Communicator> AnyCommunicator for C {
    fn get_attr<A: CommAttribute>(&self) -> Option<&A> {
        self.as_handle().attrs.get(&TypeId::of::<A>()).and_then(|b| b.as_any().downcast_ref::<A>())
    }
    fn set_attr<A: CommAttribute>(&mut self, val: A) {
        let h =
            self.as_handle_mut().unwrap_or_else(|| panic!("mpi: set_attr: attributes are set on a communicator, not on a process handle"));
        h.attrs.insert(TypeId::of::<A>(), Box::new(crate::attribute::Entry(val)));
    }
}

/// One process of a communicator.
#[derive(Copy, Clone)]
pub struct Process<'a> {
    handle: &'a CommHandle,
    rank: Rank,
}

impl<'a> Process<'a> {
    /// Its rank.
    pub fn rank(&self) -> Rank {
        self.rank
    }
    /// Whether it is this process.
    pub fn is_self(&self) -> bool {
        self.rank == iidx(self.handle.comm.rank())
    }
}

impl sealed::AsHandle for Process<'_> {
    fn as_handle(&self) -> &CommHandle {
        self.handle
    }
}
impl Communicator for Process<'_> {}
impl<'a> AsCommunicator for Process<'a> {
    type Out = AnyProcess<'a>;
    fn as_communicator(&self) -> &AnyProcess<'a> {
        // SAFETY: `AnyProcess` is a `repr(transparent)` wrapper of the reference that is the
        // first field of `Process` (`repr(C)` not needed: we point at the field itself).
        unsafe { &*(&self.handle as *const &'a CommHandle as *const AnyProcess<'a>) }
    }
}

/// Any process of a communicator (a receive source matching every rank).
#[derive(Copy, Clone)]
#[repr(transparent)]
pub struct AnyProcess<'a>(&'a CommHandle);

impl sealed::AsHandle for AnyProcess<'_> {
    fn as_handle(&self) -> &CommHandle {
        self.0
    }
}
impl Communicator for AnyProcess<'_> {}
impl AsCommunicator for AnyProcess<'_> {
    type Out = Self;
    fn as_communicator(&self) -> &Self {
        self
    }
}

/// A group of processes.
pub trait Group {
    /// tmpi's group.
    #[doc(hidden)]
    fn tgroup(&self) -> tmpi::Group;

    /// Members of either group.
    fn union<G: Group>(&self, other: &G) -> UserGroup
    where
        Self: Sized,
    {
        UserGroup(self.tgroup().union(&other.tgroup()))
    }
    /// Members of both groups.
    fn intersection<G: Group>(&self, other: &G) -> UserGroup
    where
        Self: Sized,
    {
        UserGroup(self.tgroup().intersection(&other.tgroup()))
    }
    /// Members of this group not in the other.
    fn difference<G: Group>(&self, other: &G) -> UserGroup
    where
        Self: Sized,
    {
        UserGroup(self.tgroup().difference(&other.tgroup()))
    }
    /// The members at these ranks, in this order.
    fn include(&self, ranks: &[Rank]) -> UserGroup {
        let r: Vec<usize> = ranks.iter().map(|&x| uidx(x, "Group::include")).collect();
        UserGroup(ok(self.tgroup().incl(&r), "Group::include"))
    }
    /// The members except these ranks.
    fn exclude(&self, ranks: &[Rank]) -> UserGroup {
        let r: Vec<usize> = ranks.iter().map(|&x| uidx(x, "Group::exclude")).collect();
        UserGroup(ok(self.tgroup().excl(&r), "Group::exclude"))
    }
    /// The number of members.
    fn size(&self) -> Rank {
        iidx(self.tgroup().size())
    }
    /// This process's rank in the group, if a member.
    fn rank(&self) -> Option<Rank> {
        self.tgroup().rank().map(iidx)
    }
    /// The rank in `other` of this group's rank `rank`.
    fn translate_rank<G: Group>(&self, rank: Rank, other: &G) -> Option<Rank>
    where
        Self: Sized,
    {
        self.translate_ranks(&[rank], other)[0]
    }
    /// The ranks in `other` of these ranks of this group.
    fn translate_ranks<G: Group>(&self, ranks: &[Rank], other: &G) -> Vec<Option<Rank>>
    where
        Self: Sized,
    {
        let r: Vec<usize> = ranks.iter().map(|&x| uidx(x, "Group::translate_ranks")).collect();
        ok(self.tgroup().translate_ranks(&r, &other.tgroup()), "Group::translate_ranks").into_iter().map(|x| x.map(iidx)).collect()
    }
    /// How the groups relate.
    fn compare<G: Group>(&self, other: &G) -> GroupRelation
    where
        Self: Sized,
    {
        match self.tgroup().compare(&other.tgroup()) {
            tmpi::GroupCmp::Identical => GroupRelation::Identical,
            tmpi::GroupCmp::Similar => GroupRelation::Similar,
            _ => GroupRelation::Unequal,
        }
    }
}

/// A predefined group (the empty group).
#[derive(Copy, Clone, Debug)]
pub struct SystemGroup(());

impl SystemGroup {
    /// The empty group.
    pub fn empty() -> SystemGroup {
        SystemGroup(())
    }
}

impl Group for SystemGroup {
    fn tgroup(&self) -> tmpi::Group {
        crate::state::world_comm("SystemGroup::empty").group().empty()
    }
}

/// A group made by this program.
#[derive(Clone, Debug)]
pub struct UserGroup(tmpi::Group);

impl Group for UserGroup {
    fn tgroup(&self) -> tmpi::Group {
        self.0.clone()
    }
}

/// The dimensions, periodicity and this process's coordinates of a Cartesian grid.
#[derive(Clone, Debug)]
pub struct CartesianLayout {
    /// Processes along each dimension.
    pub dims: Vec<Count>,
    /// Whether each dimension wraps around.
    pub periods: Vec<bool>,
    /// This process's coordinates.
    pub coords: Vec<Count>,
}

/// A communicator with a Cartesian grid.
pub struct CartesianCommunicator(pub(crate) SimpleCommunicator);

impl CartesianCommunicator {
    fn cart(&self) -> &tmpi::CartComm {
        self.0 .0.cart.as_ref().expect("a Cartesian communicator has its grid")
    }

    /// The number of dimensions.
    pub fn num_dimensions(&self) -> Count {
        iidx(self.cart().ndims())
    }

    /// Dimensions, periods and this process's coordinates.
    pub fn get_layout(&self) -> CartesianLayout {
        let c = self.cart();
        CartesianLayout {
            dims: c.dims().iter().map(|&d| iidx(d)).collect(),
            periods: c.periods().to_vec(),
            coords: c.coords().iter().map(|&d| iidx(d)).collect(),
        }
    }

    /// [`CartesianCommunicator::get_layout`] into slices.
    pub fn get_layout_into(&self, dims: &mut [Count], periods: &mut [bool], coords: &mut [Count]) {
        let l = self.get_layout();
        let n = l.dims.len();
        assert!(dims.len() == n && periods.len() == n && coords.len() == n, "mpi: get_layout_into: slices must have {n} entries");
        dims.copy_from_slice(&l.dims);
        periods.copy_from_slice(&l.periods);
        coords.copy_from_slice(&l.coords);
    }

    /// As [`CartesianCommunicator::get_layout_into`].
    ///
    /// # Safety
    /// None beyond the checked version's (the lengths are checked anyway).
    pub unsafe fn get_layout_into_unchecked(&self, dims: &mut [Count], periods: &mut [bool], coords: &mut [Count]) {
        self.get_layout_into(dims, periods, coords)
    }

    /// The rank at coordinates.
    pub fn coordinates_to_rank(&self, coords: &[Count]) -> Rank {
        let c: Vec<isize> = coords.iter().map(|&x| x as isize).collect();
        iidx(ok(self.cart().cart_rank(&c), "coordinates_to_rank"))
    }

    /// As [`CartesianCommunicator::coordinates_to_rank`].
    ///
    /// # Safety
    /// None beyond the checked version's.
    pub unsafe fn coordinates_to_rank_unchecked(&self, coords: &[Count]) -> Rank {
        self.coordinates_to_rank(coords)
    }

    /// The coordinates of a rank.
    pub fn rank_to_coordinates(&self, rank: Rank) -> Vec<Count> {
        ok(self.cart().coords_of(uidx(rank, "rank_to_coordinates")), "rank_to_coordinates").into_iter().map(iidx).collect()
    }

    /// [`CartesianCommunicator::rank_to_coordinates`] into a slice.
    pub fn rank_to_coordinates_into(&self, rank: Rank, coords: &mut [Count]) {
        let c = self.rank_to_coordinates(rank);
        assert!(coords.len() == c.len(), "mpi: rank_to_coordinates_into: the slice must have {} entries", c.len());
        coords.copy_from_slice(&c);
    }

    /// As [`CartesianCommunicator::rank_to_coordinates_into`].
    ///
    /// # Safety
    /// None beyond the checked version's.
    pub unsafe fn rank_to_coordinates_into_unchecked(&self, rank: Rank, coords: &mut [Count]) {
        self.rank_to_coordinates_into(rank, coords)
    }

    /// The source and destination of a shift by `displacement` along `dimension`.
    pub fn shift(&self, dimension: Count, displacement: Count) -> (Option<Rank>, Option<Rank>) {
        let (s, d) = ok(self.cart().shift(uidx(dimension, "shift"), displacement as isize), "shift");
        (s.map(iidx), d.map(iidx))
    }

    /// As [`CartesianCommunicator::shift`].
    ///
    /// # Safety
    /// None beyond the checked version's.
    pub unsafe fn shift_unchecked(&self, dimension: Count, displacement: Count) -> (Option<Rank>, Option<Rank>) {
        self.shift(dimension, displacement)
    }

    /// The sub-grid keeping the dimensions marked `true` (collective).
    pub fn subgroup(&self, retain: &[bool]) -> CartesianCommunicator {
        let sub = ok(self.cart().sub(retain), "subgroup");
        let mut h = CommHandle::new(sub.comm().clone());
        h.cart = Some(sub);
        CartesianCommunicator(SimpleCommunicator(h))
    }

    /// As [`CartesianCommunicator::subgroup`].
    ///
    /// # Safety
    /// None beyond the checked version's.
    pub unsafe fn subgroup_unchecked(&self, retain: &[bool]) -> CartesianCommunicator {
        self.subgroup(retain)
    }
}

impl sealed::AsHandle for CartesianCommunicator {
    fn as_handle(&self) -> &CommHandle {
        &self.0 .0
    }
    fn as_handle_mut(&mut self) -> Option<&mut CommHandle> {
        Some(&mut self.0 .0)
    }
}
impl Communicator for CartesianCommunicator {}
impl AsCommunicator for CartesianCommunicator {
    type Out = CartesianCommunicator;
    fn as_communicator(&self) -> &Self::Out {
        self
    }
}
