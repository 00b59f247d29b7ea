//! Runs a model exhaustively and says what it found: the states explored,
//! the time, each property that failed with its counterexample printed
//! step by step, and each "sometimes" property never met (a model that
//! cannot reach its goal proves nothing).
//!
//! Called by the tests (`tests/`), which expect every property to hold on
//! today's code and each past bug to be found, and by the command line
//! (`cargo run -p sink-model --release -- --help`).

use std::fmt::{self, Debug};
use std::hash::Hash;
use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, HasDiscoveries, Model};

/// A model that can say, in words, what a state holds: the last line of a
/// counterexample.
pub trait Explained: Model {
    /// What `state` shows about the properties (the rules broken, what the
    /// destination holds).
    fn explain(&self, state: &Self::State) -> String;

    /// One step of a counterexample, in words: `action` taken in `before`.
    fn describe(&self, before: &Self::State, action: &Self::Action) -> String;
}

/// A property that failed, with the shortest path to it.
#[derive(Debug, Clone)]
pub struct Counterexample {
    /// The property's name: its rule in `docs/semantics.md`.
    pub property: &'static str,
    /// The events in order, one per line, then what the last state shows.
    pub trace: String,
    /// The same path for stateright's explorer (`--serve ADDR`, then
    /// `http://ADDR/#/steps/` followed by this).
    pub explorer_path: String,
}

/// What a check found.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The world, in words.
    pub world: String,
    /// Distinct states explored.
    pub states: usize,
    /// States generated, repeats included.
    pub generated: usize,
    /// The longest path explored.
    pub depth: usize,
    /// How long it took.
    pub elapsed: Duration,
    /// Properties that failed.
    pub failures: Vec<Counterexample>,
    /// "Sometimes" properties never met.
    pub never_met: Vec<&'static str>,
    /// The properties checked.
    pub properties: Vec<&'static str>,
}

impl Outcome {
    /// True when every property held and every goal was met.
    pub fn holds(&self) -> bool {
        self.failures.is_empty() && self.never_met.is_empty()
    }

    /// The counterexample of `property`, if it failed.
    pub fn failure(&self, property: &str) -> Option<&Counterexample> {
        self.failures.iter().find(|c| c.property == property)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "world: {}", self.world)?;
        writeln!(
            f,
            "  {} states ({} generated), depth {}, {:.1} s",
            self.states,
            self.generated,
            self.depth,
            self.elapsed.as_secs_f64()
        )?;
        for property in &self.properties {
            let verdict = match (self.failure(property), self.never_met.contains(property)) {
                (Some(_), _) => "FAILS",
                (None, true) => "NEVER MET",
                (None, false) => "holds",
            };
            writeln!(f, "  {verdict:9} {property}")?;
        }
        for failure in &self.failures {
            writeln!(f, "\ncounterexample to \"{}\":", failure.property)?;
            f.write_str(&failure.trace)?;
            writeln!(
                f,
                "  in stateright's explorer (the same flags and --serve ADDR): http://ADDR/#/steps/{}",
                failure.explorer_path
            )?;
        }
        Ok(())
    }
}

/// How far a check goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Checker threads.
    pub threads: usize,
    /// Explore to this depth only; `None`: every reachable state.
    pub depth: Option<usize>,
    /// When to stop before every state is explored.
    pub stop: Stop,
}

/// When a check stops before every reachable state is explored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Never: a proof over the whole world.
    Never,
    /// At the first property that fails: a search for a bug.
    AnyFailure,
    /// Once this property failed: a search for one bug's counterexample
    /// (others it breaks on the way are reported too).
    Property(&'static str),
}

impl Bounds {
    /// Every reachable state, on one thread: what the tests run beside
    /// each other.
    pub fn exhaustive() -> Bounds {
        Bounds {
            threads: 1,
            depth: None,
            stop: Stop::Never,
        }
    }

    /// Until `property` fails, on one thread.
    pub fn until_broken(property: &'static str) -> Bounds {
        Bounds {
            stop: Stop::Property(property),
            ..Bounds::exhaustive()
        }
    }
}

/// Checks `model`, breadth first (so each counterexample is a shortest
/// one), within `bounds`. `world` names what is checked.
pub fn check<M>(model: M, world: String, bounds: Bounds) -> Outcome
where
    M: Explained + Send + Sync + Clone + 'static,
    M::State: Clone + Debug + Hash + PartialEq + Send + Sync + 'static,
    M::Action: Clone + Debug + PartialEq + Send + Sync + 'static,
{
    let properties = model.properties();
    let started = Instant::now();
    let mut builder = model.clone().checker().threads(bounds.threads.max(1));
    if let Some(depth) = bounds.depth {
        builder = builder.target_max_depth(depth);
    }
    match bounds.stop {
        Stop::Never => {}
        Stop::AnyFailure => builder = builder.finish_when(HasDiscoveries::AnyFailures),
        Stop::Property(name) => {
            builder = builder.finish_when(HasDiscoveries::AnyOf([name].into_iter().collect()))
        }
    }
    let checker = builder.spawn_bfs().join();
    let elapsed = started.elapsed();
    let mut discoveries = checker.discoveries();
    let mut failures = Vec::new();
    let mut never_met = Vec::new();
    for property in &properties {
        let found = discoveries.remove(property.name);
        match (&property.expectation, found) {
            (Expectation::Sometimes, None) => never_met.push(property.name),
            (Expectation::Sometimes, Some(_)) => {}
            (_, Some(path)) => {
                // The checker's path ends at a state where the property
                // fails; the rules broken stay broken, so cut it at the
                // first such state: the events up to the violation.
                let mut steps = path.into_vec();
                if let Some(first) = steps
                    .iter()
                    .position(|(state, _)| !(property.condition)(&model, state))
                {
                    steps.truncate(first + 1);
                    if let Some(last) = steps.last_mut() {
                        last.1 = None;
                    }
                }
                failures.push(Counterexample {
                    property: property.name,
                    explorer_path: encode(&model, &steps),
                    trace: render(&model, steps),
                })
            }
            (_, None) => {}
        }
    }
    Outcome {
        world,
        states: checker.unique_state_count(),
        generated: checker.state_count(),
        depth: checker.max_depth(),
        elapsed,
        failures,
        never_met,
        properties: properties.iter().map(|p| p.name).collect(),
    }
}

/// A path as stateright's explorer addresses it: the index of its first
/// state among the initial ones, then of each action among those possible.
fn encode<M>(model: &M, steps: &[(M::State, Option<M::Action>)]) -> String
where
    M: Model,
    M::State: PartialEq,
    M::Action: PartialEq,
{
    let mut indices = Vec::new();
    if let Some((first, _)) = steps.first() {
        let init = model.init_states().iter().position(|s| s == first);
        indices.push(init.unwrap_or(0));
    }
    for (state, action) in steps {
        if let Some(action) = action {
            let mut possible = Vec::new();
            model.actions(state, &mut possible);
            indices.push(possible.iter().position(|a| a == action).unwrap_or(0));
        }
    }
    let indices: Vec<String> = indices.iter().map(usize::to_string).collect();
    indices.join("/")
}

/// The steps of a path, numbered, then what its last state shows.
fn render<M: Explained>(model: &M, path: Vec<(M::State, Option<M::Action>)>) -> String
where
    M::Action: Debug,
{
    // `describe` reads the state before each action.
    let mut out = String::new();
    let mut step = 0;
    let mut last = None;
    for (state, action) in path {
        if let Some(action) = action {
            step += 1;
            out.push_str(&format!(
                "  {step:3}. {}\n",
                model.describe(&state, &action)
            ));
        }
        last = Some(state);
    }
    if let Some(state) = last {
        out.push_str(&format!("  then: {}\n", model.explain(&state)));
    }
    out
}
