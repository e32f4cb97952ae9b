//! A trace as a readable timeline: one line per step, at its tick.

use stateright::Path;

use crate::Checked;

/// Each step of `path` as `t=NN  what happened`.
pub fn render<M: Checked>(model: &M, path: &Path<M::State, M::Action>) -> String
where
    M::State: Clone,
    M::Action: Clone,
{
    let mut out = String::new();
    let steps = path.clone().into_vec();
    for (state, action) in steps {
        let Some(action) = action else { continue };
        let line = model.describe(&state, &action);
        if !line.is_empty() {
            out.push_str(&format!("  t={:>2}  {line}\n", M::now(&state)));
        }
    }
    out
}
