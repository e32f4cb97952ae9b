//! A trace as a readable timeline: one line per step, at the instant it left the model in.

use stateright::Path;

use crate::Checked;

/// Each step of `path` as `t=NN.NN  what happened`.
pub fn render<M: Checked>(model: &M, path: &Path<M::State, M::Action>) -> String
where
    M::State: Clone,
    M::Action: Clone,
{
    let mut out = String::new();
    let steps = path.clone().into_vec();
    for pair in steps.windows(2) {
        let [(state, Some(action)), (after, _)] = pair else {
            continue;
        };
        let line = model.describe(state, action);
        if !line.is_empty() {
            out.push_str(&format!("  t={:>5.2}  {line}\n", M::now(after)));
        }
    }
    out
}
