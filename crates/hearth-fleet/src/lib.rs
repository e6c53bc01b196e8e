//! Fleet logic of Hearth: where a sandbox runs, how many hosts run, and
//! how that count is applied. Pure decisions plus thin backends, so the
//! control plane calls them and tests and a simulation exercise the exact
//! same code.
//!
//! - [`placement`]: [`place`] chooses a host for a sandbox from a snapshot
//!   of the fleet ([`HostView`]). Eligible hosts are ready, hold a live
//!   lease, are not draining and reported with their lease that their
//!   object store answers; among those with room for the committed
//!   CPU and memory (and the disk, when hosts report free space) the least
//!   committed CPU wins, ties by host id. A restart keeps its previous host
//!   when that host is within [`PREFER_PREVIOUS_WITHIN`] (one vCPU) of the
//!   least loaded, because its caches (disk chunks, memory image) are warm
//!   there. Refusals are typed: [`PlacementError::NoHosts`] (503
//!   `NoSandboxHostsAvailable`; LangSmith keeps no capacity queue) and
//!   [`PlacementError::DiskTooLarge`] (422).
//! - [`autoscale`]: [`Autoscaler::decide`] applies LangSmith's rule
//!   `ceil(committed_vCPU / (host_vCPU × target)) + headroom`, clamped to
//!   `[min, max]`, from an [`AutoscalePolicy`] (`HEARTH_AUTOSCALE_*`,
//!   [`autoscale::ENV_VARS`]). Up is immediate (a refused create costs a
//!   user), down holds the window's peak and removes one host per window
//!   (a removal drains a host: every sandbox on it is saved and moves).
//!   Operator overrides ([`Override`]) win.
//! - [`backend`]: [`ScaleBackend`] reads and sets the replica count:
//!   [`CommandHook`] runs an operator's program, [`KubeDeployment`]
//!   (feature `kube`, on by default) patches the host Deployment's `scale`
//!   subresource, as LangSmith does.
//! - [`sim`]: a deterministic simulation (own PRNG, fixed seed) of a fleet
//!   under churn, driving [`place`] and [`Autoscaler`] and checking
//!   invariants as it goes; `benches/fleet_sim.rs` runs it at 1,000 hosts
//!   and 100,000 sandboxes and prints the numbers.
//!
//! Leader election for the autoscaler and the fleet's signing keys live
//! in `hearth-db` (`Db::acquire_leadership`, `Db::register_signing_key`):
//! only that crate speaks SQL.

pub mod autoscale;
pub mod backend;
pub mod placement;
pub mod sim;

pub use autoscale::{Action, AutoscalePolicy, Autoscaler, Decision, Override, PolicyError, Signal};
#[cfg(feature = "kube")]
pub use backend::KubeDeployment;
pub use backend::{CommandHook, ScaleBackend, ScaleError};
pub use placement::{place, HostView, PlacementError, PlacementRequest, PREFER_PREVIOUS_WITHIN};
