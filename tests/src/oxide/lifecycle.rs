//! Instance run-state machine: entering a state, the timed follow-up transitions it arms,
//! and the `RackEvents` notifications its edges produce.
//!
//! Everything here runs under the simulator's lock and only *records* effects (events to
//! deliver, timers to arm); `OxideSim` carries them out after releasing the lock, so event
//! handlers can call back into the simulator and timers never run under the lock.

use std::net::IpAddr;
use std::time::Duration;

use chrono::Utc;
use uuid::Uuid;

use super::faults::FaultSpec;
use super::store::{Console, RunState, Store};
use super::{RunningInstance, Timings};

/// A notification for `RackEvents`, delivered after the lock is released.
#[derive(Debug)]
pub enum Event {
    /// The instance reached `running`.
    Running(RunningInstance),
    /// The instance left `running`.
    Halted(Uuid),
    /// The instance was deleted.
    Deleted(Uuid),
    /// A floating IP was attached (`Some`) or detached (`None`).
    FloatingIp(IpAddr, Option<Uuid>),
}

/// Which timed transition a timer performs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// `creating` → `starting`.
    CreatedStart,
    /// `creating` → `stopped` (created with `start = false`).
    CreatedStopped,
    /// `starting` → `running` (or `failed` for `fail_at_boot` names).
    Booted,
    /// `stopping` → `stopped`.
    Stopped,
    /// `rebooting` → `running`.
    Rebooted,
    /// `failed` → `starting`: nexus's `instance_reincarnation` background task.
    Reincarnate,
}

/// A transition to perform after `after`, if the instance is still at `generation`.
#[derive(Clone, Copy, Debug)]
pub struct Timer {
    pub instance: Uuid,
    pub generation: u64,
    pub after: Duration,
    pub step: Step,
}

/// What a request or timer did besides changing the store.
#[derive(Debug, Default)]
pub struct Effects {
    pub events: Vec<Event>,
    pub timers: Vec<Timer>,
    /// A firewall write was undone by the `overwritten_firewall_writes` fault (one used up).
    pub firewall_write_overwritten: bool,
}

/// Read-only inputs of the state machine.
#[derive(Debug)]
pub struct Env<'a> {
    pub timings: &'a Timings,
    pub faults: &'a FaultSpec,
}

/// Moves instance `id` to `state`: bumps its generation (cancelling pending timers), records
/// the edge's events and arms the follow-up timer of transient states.
pub fn enter(store: &mut Store, id: Uuid, state: RunState, fx: &mut Effects, env: &Env<'_>) {
    let Some(inst) = store.instances.get_mut(&id) else {
        return;
    };
    let old = inst.state;
    inst.state = state;
    inst.generation = inst.generation.wrapping_add(1);
    let now = Utc::now();
    inst.time_run_state_updated = now;
    inst.times.modified = now;
    if state == RunState::Starting {
        // A start creates a new VMM, whose serial console begins empty.
        inst.console = Console::default();
    }
    let generation = inst.generation;
    let name = inst.name.to_string();
    let reincarnate_after =
        (state == RunState::Failed && inst.auto_restart_enabled() && inst.intended_running)
            .then(|| reincarnation_delay(inst.time_last_auto_restarted, env.timings));

    if old == RunState::Running && state != RunState::Running {
        fx.events.push(Event::Halted(id));
    }
    let timer = |after: Duration, step: Step| Timer {
        instance: id,
        generation,
        after,
        step,
    };
    match state {
        RunState::Running => {
            if let Some(ri) = running_instance(store, id) {
                fx.events.push(Event::Running(ri));
            }
        }
        RunState::Starting => fx
            .timers
            .push(timer(env.timings.starting_to_running, Step::Booted)),
        RunState::Stopping => {
            if !FaultSpec::matches(&env.faults.hang_stopping, &name) {
                fx.timers
                    .push(timer(env.timings.stopping_to_stopped, Step::Stopped));
            }
        }
        RunState::Rebooting => fx.timers.push(timer(env.timings.rebooting, Step::Rebooted)),
        RunState::Failed => {
            if let Some(after) = reincarnate_after {
                fx.timers.push(timer(after, Step::Reincarnate));
            }
        }
        RunState::Creating | RunState::Stopped => {}
    }
}

/// How long a failed instance waits for its automatic restart: the task's period, or longer
/// while the cooldown since the last automatic restart has not run out.
fn reincarnation_delay(last: Option<chrono::DateTime<Utc>>, timings: &Timings) -> Duration {
    let cooldown_left = last
        .and_then(|t| {
            (t + timings.reincarnation_cooldown)
                .signed_duration_since(Utc::now())
                .to_std()
                .ok()
        })
        .unwrap_or_default();
    timings.reincarnation_delay.max(cooldown_left)
}

/// Arms the `creating` → `starting`/`stopped` timer of a freshly created instance.
pub fn arm_create(store: &Store, id: Uuid, start: bool, fx: &mut Effects, env: &Env<'_>) {
    if let Some(inst) = store.instances.get(&id) {
        fx.timers.push(Timer {
            instance: id,
            generation: inst.generation,
            after: env.timings.create_to_starting,
            step: if start {
                Step::CreatedStart
            } else {
                Step::CreatedStopped
            },
        });
    }
}

/// Performs a due timer, unless the instance is gone or changed state since it was armed.
pub fn fire(store: &mut Store, t: Timer, fx: &mut Effects, env: &Env<'_>) {
    let Some(inst) = store.instances.get(&t.instance) else {
        return;
    };
    if inst.generation != t.generation {
        return;
    }
    let name = inst.name.to_string();
    let next = match (t.step, inst.state) {
        (Step::CreatedStart, RunState::Creating) => RunState::Starting,
        (Step::CreatedStopped, RunState::Creating) => RunState::Stopped,
        (Step::Booted, RunState::Starting) => {
            if FaultSpec::matches(&env.faults.fail_at_boot, &name) {
                RunState::Failed
            } else {
                RunState::Running
            }
        }
        (Step::Stopped, RunState::Stopping) => RunState::Stopped,
        (Step::Rebooted, RunState::Rebooting) => RunState::Running,
        // A stop in between cleared the intent (and moved it to `stopped` anyway).
        (Step::Reincarnate, RunState::Failed)
            if inst.auto_restart_enabled() && inst.intended_running =>
        {
            if let Some(inst) = store.instances.get_mut(&t.instance) {
                inst.time_last_auto_restarted = Some(Utc::now());
            }
            RunState::Starting
        }
        _ => return,
    };
    enter(store, t.instance, next, fx, env);
}

/// What `RackEvents::instance_running` receives for instance `id`.
pub fn running_instance(store: &Store, id: Uuid) -> Option<RunningInstance> {
    let inst = store.instances.get(&id)?;
    Some(RunningInstance {
        id,
        name: inst.name.to_string(),
        hostname: inst.hostname.clone(),
        project: store.project_name(inst.project_id),
        user_data: inst.user_data.clone(),
        external_ips: store.reachable_ips(id),
        private_ip: inst
            .private_ip()
            .and_then(|ip| store.projects.get(&inst.project_id)?.subnet.rack_addr(ip))
            .map(IpAddr::V4),
        private_loopback: inst.private_ip().map(IpAddr::V4),
        ssh_public_keys: inst.ssh_keys.clone(),
        ncpus: inst.ncpus,
        memory: inst.memory,
        disk_serials: store
            .disks
            .values()
            .filter(|d| d.state == super::store::DiskState::Attached(id))
            .map(|d| nvme_serial(d.name.as_str()))
            .collect(),
    })
}

/// omicron: the NVMe serial is the disk name's first 20 bytes (NUL-padded; Linux prints it
/// up to the first NUL).
pub(super) fn nvme_serial(name: &str) -> String {
    let mut end = name.len().min(20);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_owned()
}
