//! Checking a plan before anything runs: every problem found, in one error.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde_json::Value;
pub(crate) use tower_toolcall::envelope::json_kind;

use super::config::RunPolicy;
use super::plan::Plan;
use super::reference::{self, Source};
use tower_toolcall::registry::ToolRegistry;

/// A plan that cannot run, with every problem found in it; nothing was dispatched.
///
/// ```
/// use serde_json::json;
/// use tower_toolcall_executor::{Executor, Plan};
/// use tower_toolcall::registry::ToolRegistry;
///
/// let plan = Plan::from_value(json!({"steps": [
///     {"id": "a", "tool": "web::search", "args": {"q": "$steps.b.title"}},
///     {"id": "b", "tool": "web::fetch", "args": {"url": "$steps.a.url", "n": "$vars.missing"}}
/// ]}))?;
/// let err = Executor::builder(ToolRegistry::open()).build().unwrap().check(&plan).unwrap_err();
/// assert_eq!(err.problems().len(), 2);
/// assert!(err.to_string().contains("dependency cycle a -> b -> a"));
/// assert!(err.to_string().contains("`steps[1].args.n`"));
/// # Ok::<(), tower_toolcall_executor::PlanError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanError {
    problems: Vec<PlanProblem>,
}

/// One problem of a plan: the member it is in and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PlanProblem {
    /// The member, e.g. `steps[2].tool`.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

impl PlanError {
    pub(crate) fn single(field: impl Into<String>, problem: impl Into<String>) -> Self {
        PlanError {
            problems: vec![PlanProblem {
                field: field.into(),
                problem: problem.into(),
            }],
        }
    }

    /// Every problem, in the order of the plan.
    pub fn problems(&self) -> &[PlanProblem] {
        &self.problems
    }
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        write!(
            f,
            "invalid plan ({n} problem{}): ",
            if n == 1 { "" } else { "s" }
        )?;
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "`{}` {}", p.field, p.problem)?;
        }
        f.write_str("; fix the plan and submit it again; nothing was run")
    }
}

impl std::error::Error for PlanError {}

/// A tool named by a step: split into namespace and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ToolName {
    pub(crate) namespace: String,
    pub(crate) name: String,
    full: String,
}

impl ToolName {
    pub(crate) fn parse(tool: &str) -> Option<ToolName> {
        let (namespace, name) = tool.rsplit_once("::").or_else(|| tool.rsplit_once('.'))?;
        (!namespace.is_empty() && !name.is_empty()).then(|| ToolName {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            full: format!("{namespace}::{name}"),
        })
    }

    /// `namespace::name`.
    pub(crate) fn full(&self) -> &str {
        &self.full
    }
}

/// Where a `foreach` gets its items.
#[derive(Clone, Debug)]
pub(crate) enum Items {
    /// The array written in the step's `foreach.items`.
    Inline,
    /// The plan variable of this name, an array.
    Var(String),
    /// A reference to a step's output, resolved when the step is ready.
    Reference(Value),
}

/// A step, checked, with its dependencies as indexes.
#[derive(Clone, Debug)]
pub(crate) struct CheckedStep {
    /// The primary tool, then the alternatives.
    pub(crate) tools: Vec<ToolName>,
    pub(crate) deps: Vec<usize>,
    pub(crate) dependents: Vec<usize>,
    pub(crate) mutating: bool,
    pub(crate) items: Option<Items>,
}

/// A plan that passed every check, shared rather than copied: a `foreach` over a large
/// inline array is held once by the run.
#[derive(Clone, Debug)]
pub(crate) struct CheckedPlan {
    pub(crate) plan: Arc<Plan>,
    pub(crate) steps: Vec<CheckedStep>,
}

/// Checks `plan` against `registry` and the limits of `policy`: nesting, ids, tools, static
/// args against the tools' schemas, references, dependencies and cycles, `foreach` items and
/// retry pauses. No walk of the plan recurses deeper than the depth limit, and the
/// dependency graph is walked without recursion, so a hostile plan is refused, never a
/// crash.
pub(crate) fn check(
    plan: &Plan,
    registry: &ToolRegistry,
    policy: &RunPolicy,
) -> Result<Vec<CheckedStep>, PlanError> {
    let mut problems = Problems::default();
    if plan.steps.is_empty() {
        problems.add("steps".into(), "must have at least one step".into());
    }
    let deep_text = format!("nests deeper than {} levels; flatten it", policy.max_depth);
    for (name, value) in &plan.vars {
        if reference::deeper_than(value, policy.max_depth) {
            problems.add(format!("vars.{name}"), deep_text.clone());
        }
    }
    let checker = Checker {
        plan,
        registry,
        policy,
        deep_text,
        ids: step_ids(plan, &mut problems),
        captured: plan
            .steps
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.capture_as.as_deref().map(|n| (n, i)))
            .collect(),
    };
    let mut steps: Vec<CheckedStep> = (0..plan.steps.len())
        .map(|i| checker.step(i, &mut problems))
        .collect();
    if let Some(cycle) = find_cycle(&steps) {
        problems.add(
            format!("steps[{}].dependsOn", cycle[0]),
            format!("closes a dependency cycle {}", cycle_text(&cycle, plan)),
        );
    }
    if !problems.0.is_empty() {
        return Err(PlanError {
            problems: problems.0,
        });
    }
    for i in 0..steps.len() {
        for d in steps[i].deps.clone() {
            steps[d].dependents.push(i);
        }
    }
    Ok(steps)
}

/// The problems found so far, in the order they were found.
#[derive(Default)]
struct Problems(Vec<PlanProblem>);

impl Problems {
    fn add(&mut self, field: String, problem: String) {
        self.0.push(PlanProblem { field, problem });
    }
}

/// Each step's index by its id: the first of a repeated id, each repeat a problem, as is an
/// empty id or one a reference cannot name.
fn step_ids<'a>(plan: &'a Plan, problems: &mut Problems) -> HashMap<&'a str, usize> {
    let mut ids: HashMap<&str, usize> = HashMap::new();
    for (i, step) in plan.steps.iter().enumerate() {
        if step.id.trim().is_empty() {
            problems.add(format!("steps[{i}].id"), "must not be empty".into());
        } else if let Some(first) = ids.insert(&step.id, i) {
            problems.add(
                format!("steps[{i}].id"),
                format!(
                    "repeats `{}` of steps[{first}]; give each step its own id",
                    step.id
                ),
            );
            ids.insert(&plan.steps[first].id, first);
        } else if !reference::is_name(&step.id) {
            problems.add(
                format!("steps[{i}].id"),
                format!(
                    "`{}` cannot be named by a `$steps.` reference; use only letters, digits, \
                     `_` and `-`",
                    step.id.escape_debug()
                ),
            );
        }
    }
    ids
}

/// What every step is checked against: the plan, its step ids and captured variables, the
/// registry and the run's limits.
struct Checker<'a> {
    plan: &'a Plan,
    registry: &'a ToolRegistry,
    policy: &'a RunPolicy,
    deep_text: String,
    ids: HashMap<&'a str, usize>,
    captured: HashMap<&'a str, usize>,
}

impl<'a> Checker<'a> {
    fn too_deep(&self, value: &Value) -> bool {
        reference::deeper_than(value, self.policy.max_depth)
    }

    /// The step `i`, checked; its problems added to `problems`.
    fn step(&self, i: usize, problems: &mut Problems) -> CheckedStep {
        let plan: &'a Plan = self.plan;
        let step = &plan.steps[i];
        let at = |member: &str| format!("steps[{i}].{member}");
        let args_too_deep = self.too_deep(&step.args);
        let items_too_deep = step
            .foreach
            .as_ref()
            .is_some_and(|f| self.too_deep(&f.items));
        for (member, deep) in [
            ("args", args_too_deep),
            ("foreach.items", items_too_deep),
            (
                "default",
                step.default.as_ref().is_some_and(|d| self.too_deep(d)),
            ),
        ] {
            if deep {
                problems.add(at(member), self.deep_text.clone());
            }
        }
        if let Some(name) = &step.capture_as {
            if !reference::is_name(name) {
                problems.add(
                    at("captureAs"),
                    format!(
                        "`{}` cannot be named by a `$vars.` reference; use only letters, \
                         digits, `_` and `-`",
                        name.escape_debug()
                    ),
                );
            }
        }
        if let Some(retry) = &step.retry {
            if retry.backoff_ms > self.policy.max_backoff_ms {
                problems.add(
                    at("retry.backoffMs"),
                    format!(
                        "must be at most {}, got {}; ask for a shorter pause",
                        self.policy.max_backoff_ms, retry.backoff_ms
                    ),
                );
            }
        }
        // Args too deep to walk safely are neither checked against a schema nor searched
        // for references: the plan is refused for their depth.
        let (tools, mutating) = self.tools(i, !args_too_deep, problems);
        if !step.args.is_object() {
            problems.add(at("args"), "must be a JSON object".into());
        }
        let mut deps: Vec<usize> = Vec::new();
        for dep in &step.depends_on {
            match self.ids.get(dep.as_str()) {
                Some(&d) => deps.push(d),
                None => problems.add(
                    at("dependsOn"),
                    format!("names `{dep}`, which is not a step"),
                ),
            }
        }
        let mut refs = if args_too_deep {
            Vec::new()
        } else {
            reference::references(&step.args)
        };
        let items = match step.foreach.as_ref().filter(|_| !items_too_deep) {
            Some(foreach) => self.items(i, foreach, &mut refs, problems),
            None => None,
        };
        self.references(i, refs, &mut deps, problems);
        if let Some(percent) = step.retry.and_then(|r| r.jitter_percent) {
            if percent > 100 {
                problems.add(
                    at("retry.jitterPercent"),
                    format!("must be at most 100, got {percent}"),
                );
            }
        }
        deps.sort_unstable();
        deps.dedup();
        if deps.contains(&i) {
            problems.add(at("id"), format!("step `{}` depends on itself", step.id));
            deps.retain(|&d| d != i);
        }
        CheckedStep {
            tools,
            deps,
            dependents: Vec::new(),
            mutating,
            items,
        }
    }

    /// The tools of step `i` (the primary, then the alternatives) and whether any of them
    /// may change something; the step's static args checked against each tool's schema
    /// when `walk_args` (they are not too deep to walk).
    fn tools(&self, i: usize, walk_args: bool, problems: &mut Problems) -> (Vec<ToolName>, bool) {
        let step = &self.plan.steps[i];
        let at = |member: &str| format!("steps[{i}].{member}");
        let static_args = walk_args && reference::is_static(&step.args);
        let names = std::iter::once(("tool".to_owned(), &step.tool)).chain(
            step.alternatives
                .iter()
                .enumerate()
                .map(|(k, t)| (format!("alternatives[{k}]"), t)),
        );
        let mut tools = Vec::new();
        let mut mutating = false;
        for (member, tool) in names {
            let Some(name) = ToolName::parse(tool) else {
                problems.add(
                    at(&member),
                    format!("`{tool}` must be written namespace::name"),
                );
                continue;
            };
            if self.registry.is_denied(&name.namespace, &name.name) {
                problems.add(at(&member), format!("`{tool}` is denied by policy"));
            }
            match self.registry.get(&name.namespace, &name.name) {
                Some(registered) => {
                    let d = registered.descriptor();
                    mutating |= d.risk.is_mutating() || d.confirmation_required;
                    if static_args {
                        if let Err(e) = registered.check_params(&step.args) {
                            problems
                                .add(at("args"), e.message().replace("`payload.params`", "args"));
                        }
                    }
                }
                None if self.registry.is_open() => mutating = true,
                None => problems.add(
                    at(&member),
                    format!("`{tool}` is not a registered tool; use one of the registry's tools"),
                ),
            }
            tools.push(name);
        }
        (tools, mutating)
    }

    /// Where the `foreach` of step `i` gets its items; the references of its items added to
    /// `refs`.
    fn items<'p>(
        &self,
        i: usize,
        foreach: &'p super::plan::Foreach,
        refs: &mut Vec<(String, reference::Reference<'p>)>,
        problems: &mut Problems,
    ) -> Option<Items> {
        let at = |member: &str| format!("steps[{i}].{member}");
        if foreach.max_concurrency == Some(0) {
            problems.add(
                at("foreach.maxConcurrency"),
                "must be at least 1, got 0".into(),
            );
        }
        let mut items = None;
        let found = reference::references(&foreach.items);
        match (&foreach.items, found.first()) {
            (Value::Array(_), None) => items = Some(Items::Inline),
            (Value::String(_), Some((_, r))) if found.len() == 1 => match r.source {
                Source::Var(name) if self.plan.vars.contains_key(name) && r.path.is_empty() => {
                    if self.plan.vars[name].is_array() {
                        items = Some(Items::Var(name.to_owned()));
                    } else {
                        problems.add(
                            at("foreach.items"),
                            format!("`$vars.{name}` is not an array; foreach needs one"),
                        );
                    }
                }
                Source::Binding(_) => problems.add(
                    at("foreach.items"),
                    "must be an array or a $steps / $vars reference".into(),
                ),
                _ => items = Some(Items::Reference(foreach.items.clone())),
            },
            _ => problems.add(
                at("foreach.items"),
                format!(
                    "must be an array or a $steps / $vars reference to one, got {}",
                    json_kind(&foreach.items)
                ),
            ),
        }
        refs.extend(found.into_iter().map(|(_, r)| (at("foreach.items"), r)));
        items
    }

    /// The steps the references `refs` of step `i` depend on, added to `deps`; a reference
    /// to a step, variable or binding that is not there, a problem.
    fn references(
        &self,
        i: usize,
        refs: Vec<(String, reference::Reference<'_>)>,
        deps: &mut Vec<usize>,
        problems: &mut Problems,
    ) {
        let bindings = self.plan.steps[i]
            .foreach
            .as_ref()
            .map(|f| (f.item_name.as_str(), f.index_name.as_str()));
        for (field, r) in refs {
            let field = if field.starts_with("steps[") {
                field
            } else {
                format!("steps[{i}].{field}")
            };
            match r.source {
                Source::Step(id) => match self.ids.get(id) {
                    Some(&d) => deps.push(d),
                    None => problems.add(
                        field,
                        format!("references step `{id}`, which is not in the plan"),
                    ),
                },
                Source::Var(name) => {
                    if let Some(&d) = self.captured.get(name) {
                        if !self.plan.vars.contains_key(name) {
                            deps.push(d);
                        }
                    } else if !self.plan.vars.contains_key(name) {
                        problems.add(
                            field,
                            format!("references variable `{name}`, which neither the plan's vars nor a step's captureAs sets"),
                        );
                    }
                }
                Source::Binding(name) => match bindings {
                    Some((item, index)) if name == item || name == index => {}
                    Some(_) => {}
                    None if name == "item" || name == "index" => problems.add(
                        field,
                        format!("uses `{{{}}}`, but the step has no foreach", r.text),
                    ),
                    None => {}
                },
            }
        }
    }
}

/// The ids of a cycle (first repeated at the end), the middle of a long one elided.
fn cycle_text(cycle: &[usize], plan: &Plan) -> String {
    const SHOWN: usize = 8;
    let id = |i: &usize| plan.steps[*i].id.as_str();
    if cycle.len() <= 2 * SHOWN {
        return cycle.iter().map(id).collect::<Vec<_>>().join(" -> ");
    }
    let head: Vec<&str> = cycle[..SHOWN].iter().map(id).collect();
    let tail: Vec<&str> = cycle[cycle.len() - SHOWN..].iter().map(id).collect();
    format!(
        "{} -> … ({} more steps) … -> {}",
        head.join(" -> "),
        cycle.len() - 2 * SHOWN,
        tail.join(" -> ")
    )
}

/// A cycle of the dependency graph, first step repeated at the end, if there is one.
///
/// A depth-first search with its own stack, not the thread's: a chain of 100,000 steps,
/// each depending on the next, is as safe to check as a short one.
fn find_cycle(steps: &[CheckedStep]) -> Option<Vec<usize>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    let mut marks = vec![Mark::New; steps.len()];
    // The open path: each step, and how many of its dependencies were looked at.
    let mut path: Vec<(usize, usize)> = Vec::new();
    for root in 0..steps.len() {
        if marks[root] != Mark::New {
            continue;
        }
        marks[root] = Mark::Open;
        path.push((root, 0));
        while let Some((i, next)) = path.last_mut() {
            let i = *i;
            let Some(&d) = steps[i].deps.get(*next) else {
                marks[i] = Mark::Done;
                path.pop();
                continue;
            };
            *next += 1;
            match marks[d] {
                Mark::Open => {
                    let start = path.iter().position(|&(p, _)| p == d).unwrap_or(0);
                    let mut cycle: Vec<usize> = path[start..].iter().map(|&(p, _)| p).collect();
                    cycle.reverse();
                    cycle.rotate_right(1);
                    cycle.push(cycle[0]);
                    return Some(cycle);
                }
                Mark::New => {
                    marks[d] = Mark::Open;
                    path.push((d, 0));
                }
                Mark::Done => {}
            }
        }
    }
    None
}
