//! The timing rules model-checked against the servers' behaviour (docs/quorum.md, "The model").
//!
//! Each model explores every interleaving of two holders, three members, message delays and a
//! bounded number of faults, for a TTL of 10 ticks, with leasewrap's own deadline rules on the
//! holders' side. Time is exact: it moves to the next instant at which something may happen, so
//! that a held-back message can come 1 ns before its holder gives up on it. A rule that is kept
//! here as a counterexample, and each broken twin of the shipped rules (`timing::Twin`), must be
//! found broken, and its shortest trace is printed as a timeline. `LEASEWRAP_MODEL_DEEP=1` runs
//! the deep sizes.

mod common;
mod db;
mod etcd;
mod timeline;

use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Path, Property};

use common::{Broken, World};

/// A model whose states carry the children and their resource.
pub trait Checked: Model + Sized {
    fn world(s: &Self::State) -> &World;
    /// No fault and no delay: the lease must never be lost.
    fn healthy(&self) -> bool;
    /// One step of a trace, for the timeline.
    fn describe(&self, before: &Self::State, action: &Self::Action) -> String;
    /// The instant of a state, in ticks.
    fn now(s: &Self::State) -> f64;
}

pub const OVERLAP: &str = "no two children run at one instant";
pub const FENCED: &str = "a stale holder's write after a newer one's is refused";
pub const HEALTHY: &str = "a healthy cluster never loses the lease";
pub const RENEWED: &str = "a renewal moves the deadline";
pub const HANDED_OVER: &str = "the lease changes hands";
pub const REFUSED: &str = "a stale write is refused";

pub fn properties<M: Checked>() -> Vec<Property<M>> {
    vec![
        Property::always(OVERLAP, |_, s| {
            !matches!(M::world(s).broken, Some(Broken::Overlap { .. }))
        }),
        Property::always(FENCED, |_, s| {
            !matches!(M::world(s).broken, Some(Broken::StaleWrite { .. }))
        }),
        Property::always(HEALTHY, |m: &M, s| !m.healthy() || !M::world(s).lost),
        Property::sometimes(RENEWED, |_, s| M::world(s).renewed),
        Property::sometimes(HANDED_OVER, |_, s| M::world(s).handed_over),
        Property::sometimes(REFUSED, |_, s| M::world(s).refused),
    ]
}

/// A property the checker found broken (or an example of a `sometimes` one), with its trace.
pub type Found<M> = (
    &'static str,
    Path<<M as Model>::State, <M as Model>::Action>,
);

/// What one run of the checker found.
pub struct Run<M: Checked> {
    pub model: M,
    pub states: usize,
    pub seconds: f64,
    pub found: Vec<Found<M>>,
}

/// Check `model` exhaustively, breadth first (so a counterexample is a shortest one).
pub fn check<M>(name: &str, model: M) -> Run<M>
where
    M: Checked + Clone + Send + Sync + 'static,
    M::State: Clone + std::fmt::Debug + std::hash::Hash + Send + Sync,
    M::Action: Clone + std::fmt::Debug + Send + Sync,
{
    let started = Instant::now();
    let checker = model
        .clone()
        .checker()
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    let found = checker.discoveries().into_iter().collect();
    let run = Run {
        model,
        states: checker.unique_state_count(),
        seconds: started.elapsed().as_secs_f64(),
        found,
    };
    eprintln!(
        "model {name}: {} states in {:.1} s",
        run.states, run.seconds
    );
    run
}

impl<M: Checked> Run<M>
where
    M::State: Clone,
    M::Action: Clone,
{
    pub fn found(&self, property: &str) -> Option<&Path<M::State, M::Action>> {
        self.found
            .iter()
            .find(|(p, _)| *p == property)
            .map(|(_, path)| path)
    }

    /// The property held in every state: or the timeline of how it broke.
    #[track_caller]
    pub fn holds(&self, property: &str) {
        if let Some(path) = self.found(property) {
            panic!(
                "{property}: broken\n{}",
                timeline::render(&self.model, path)
            );
        }
    }

    /// The property broke: print how, as a timeline.
    #[track_caller]
    pub fn breaks(&self, property: &str) -> String {
        let Some(path) = self.found(property) else {
            panic!(
                "{property}: the checker found no counterexample in {} states",
                self.states
            );
        };
        let text = timeline::render(&self.model, path);
        let steps = path.clone().into_actions().len();
        eprintln!("{property}: broken, shortest trace {steps} steps\n{text}");
        text
    }

    /// Some state shows this (the model did not pass by never getting there).
    #[track_caller]
    pub fn reaches(&self, property: &str) {
        assert!(self.found(property).is_some(), "never: {property}");
    }
}

/// The model finds leasewrap's rule with its broken `twin` in place of it broken, in the same
/// `model` where the rule itself holds (checked here, or by a run of a model with more faults).
/// The twin's shortest trace, as a timeline.
#[track_caller]
pub fn twin_breaks<M>(name: &str, model: M, twin: leasewrap::lease::timing::Twin) -> String
where
    M: Checked + Twinned + Clone + Send + Sync + 'static,
    M::State: Clone + std::fmt::Debug + std::hash::Hash + Send + Sync,
    M::Action: Clone + std::fmt::Debug + Send + Sync,
{
    check(&format!("{name}: the twin"), model.with_twin(twin)).breaks(OVERLAP)
}

/// A model whose holders can follow a broken twin of leasewrap's rule.
pub trait Twinned {
    fn with_twin(self, twin: leasewrap::lease::timing::Twin) -> Self;
}

/// The deep sizes, on request.
pub fn deep() -> bool {
    std::env::var_os("LEASEWRAP_MODEL_DEEP").is_some_and(|v| v == "1")
}

mod db_checks;
mod etcd_checks;
mod zk;
mod zk_checks;
