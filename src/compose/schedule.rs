//! Realizing a plan's patterns side by side: one realization at a time per GPU, each distinct
//! problem once (patterns of twelve layers share a handful), in the plan's order except that
//! while the sibling rounds' batch compiles (`measure_ahead`), the patterns that need nothing of
//! it go first, so the GPUs measure while nvcc compiles. A pattern whose problem gets no kernel,
//! or none faster than torch, goes on to the smaller pattern it falls back to (`Kind::unfused`),
//! as one chain. What a
//! realization does with the tables and the agent is `realize`'s; here is only who runs what
//! when, and the first error stops every realization not yet started.

use super::realize::{finish, lock, realize, Ahead, RealizeCtx, Realized, Shared};
use super::{ComposeError, ProblemKey, Realization};
use crate::kinds::{Found, Problem};
use crate::nvcc;
use crate::table::{Lookup, TableKey};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

/// A pattern's problem and the smaller ones it falls back to, in turn (`Kind::unfused`).
pub(super) struct Chain {
    pub id: String,
    pub problems: Vec<Problem>,
    pub keys: Vec<ProblemKey>,
    /// (what is left to torch, what is realized instead): `falls[i]` leads from `problems[i]`
    /// to `problems[i + 1]`.
    pub falls: Vec<(&'static str, &'static str)>,
}

impl Chain {
    /// A problem of its own, with no smaller one to fall back to.
    pub fn alone(id: String, p: Problem) -> Chain {
        Chain {
            id,
            keys: vec![ProblemKey::of(&p)],
            problems: vec![p],
            falls: vec![],
        }
    }

    pub fn of(f: &Found) -> Chain {
        let mut problems = vec![f.problem()];
        let mut falls = vec![];
        let mut next = f.kind.unfused(&*f.found);
        while let Some(u) = next {
            problems.push(u.kind.problem_of(&*u.found));
            falls.push((u.what, u.instead));
            next = u.kind.unfused(&*u.found);
        }
        Chain {
            id: f.id.clone(),
            keys: problems.iter().map(ProblemKey::of).collect(),
            problems,
            falls,
        }
    }
}

/// One problem's realization, before `finish` (which may still leave a slower winner to torch).
pub(super) struct Slot {
    pub realized: Realized,
    /// Left to torch by the realization itself: a pattern with a smaller one falls back to it.
    pub skipped: bool,
}

/// What `realize_all` realized: each distinct problem once, and for each chain how many
/// fallbacks it took (0: its own problem was realized, or left to torch with none to take).
pub(super) struct AllRealized {
    pub done: BTreeMap<ProblemKey, Slot>,
    pub steps: Vec<usize>,
    /// How many of the distinct problems were swept, those whose winner then lost to torch too
    /// (`finish` leaves them to torch as it realizes them, so `done` no longer says it).
    pub swept: usize,
}

enum State {
    Running,
    Done(Box<Slot>),
    Failed,
}

/// Who realizes what: the chains not yet taken, each problem's state, the first error.
struct Board<'a> {
    chains: &'a [Chain],
    /// Whether each chain's first problem is a sweep measured ahead, which waits for the batch.
    gated: Vec<bool>,
    taken: Mutex<Vec<bool>>,
    states: Mutex<BTreeMap<ProblemKey, State>>,
    changed: Condvar,
    error: Mutex<Option<ComposeError>>,
    steps: Mutex<Vec<usize>>,
}

impl Board<'_> {
    fn failed(&self) -> bool {
        lock(&self.error).is_some()
    }

    /// The next chain to realize: the first not taken, passing over those that wait for the
    /// sibling batch while it compiles (and waiting for it when only those are left).
    fn next(&self, ahead: &Ahead) -> Option<usize> {
        loop {
            if self.failed() {
                return None;
            }
            let open = ahead.siblings.is_open();
            {
                let mut taken = lock(&self.taken);
                let pick = (0..self.chains.len()).find(|&i| !taken[i] && (open || !self.gated[i]));
                if let Some(i) = pick {
                    taken[i] = true;
                    return Some(i);
                }
                if taken.iter().all(|&t| t) {
                    return None;
                }
            }
            ahead.siblings.wait();
        }
    }

    /// `key`'s realization by `run`, once: the first asking runs it, the others wait for it.
    /// Whether it was left to torch; None after an error (its own or another realization's).
    fn realize(
        &self,
        key: &ProblemKey,
        run: impl FnOnce() -> Result<Realized, ComposeError>,
    ) -> Option<bool> {
        let mut states = lock(&self.states);
        loop {
            match states.get(key) {
                Some(State::Done(slot)) => return Some(slot.skipped),
                Some(State::Failed) => return None,
                Some(State::Running) => {
                    states = self.changed.wait(states).unwrap_or_else(|e| e.into_inner());
                }
                None => break,
            }
        }
        if self.failed() {
            return None;
        }
        states.insert(key.clone(), State::Running);
        drop(states);
        let result = run();
        let mut states = lock(&self.states);
        let out = match result {
            Ok(realized) => {
                let skipped = matches!(realized.how, Realization::Skipped { .. });
                states.insert(
                    key.clone(),
                    State::Done(Box::new(Slot { realized, skipped })),
                );
                Some(skipped)
            }
            Err(e) => {
                states.insert(key.clone(), State::Failed);
                lock(&self.error).get_or_insert(e);
                None
            }
        };
        self.changed.notify_all();
        out
    }

    /// One worker: chains until none is left (or an error stops them).
    fn work(&self, ahead: &Ahead, realize_one: &RealizeOne) {
        while let Some(i) = self.next(ahead) {
            let chain = &self.chains[i];
            let mut step = 0;
            loop {
                let problem = &chain.problems[step];
                let Some(skipped) =
                    self.realize(&chain.keys[step], || realize_one(&chain.id, problem))
                else {
                    return;
                };
                if skipped && step + 1 < chain.problems.len() {
                    step += 1;
                } else {
                    break;
                }
            }
            lock(&self.steps)[i] = step;
        }
    }
}

/// How one problem is realized, for the pattern of the id given (`realize`; tests script it).
type RealizeOne<'a> = dyn Fn(&str, &Problem) -> Result<Realized, ComposeError> + Sync + 'a;

/// The sweeps a full phase has left, counted down as each is recorded, with a line for each
/// saying how many are left and, at the rate so far, about how long they take.
pub(super) struct Countdown {
    total: usize,
    done: Mutex<usize>,
    started: std::time::Instant,
    show: bool,
}

impl Countdown {
    pub fn new(total: usize, show: bool) -> Countdown {
        Countdown {
            total,
            done: Mutex::new(0),
            started: std::time::Instant::now(),
            show,
        }
    }

    /// A sweep of `what` recorded: the line, and how many are left.
    fn swept(&self, what: &str) -> (String, usize) {
        let done = {
            let mut done = lock(&self.done);
            *done += 1;
            *done
        };
        let left = self.total.saturating_sub(done);
        let eta = self.started.elapsed().as_secs_f64() / done as f64 * left as f64;
        let line = if left == 0 {
            format!("phase 2 of 2: {what} swept; no sweep left")
        } else {
            format!(
                "phase 2 of 2: {what} swept; {left} sweep(s) left, about {eta:.0} s at the rate so far"
            )
        };
        if self.show {
            eprintln!("{line}");
        }
        (line, left)
    }
}

/// Realizes every chain's problems, one realization at a time per GPU of the pool (one where
/// there is none), each distinct problem once; see the module doc for the order. `countdown`
/// counts the sweeps down where it is given.
pub(super) fn realize_all(
    cx: RealizeCtx,
    sh: Shared,
    chains: &[Chain],
    ahead: &Ahead,
    countdown: Option<&Countdown>,
) -> Result<AllRealized, ComposeError> {
    let gated = chains
        .iter()
        .map(|c| {
            let p = &c.problems[0];
            p.math(cx.opts.precision)
                .is_some_and(|math| ahead.waits(&TableKey::of(p, math, cx.opts.arch)))
        })
        .collect();
    let workers = cx.pool.gpus().len().max(1);
    let swept = AtomicUsize::new(0);
    // The problems some chain realizes as its own pattern's; the others are only fallen back to.
    let own: BTreeSet<&ProblemKey> = chains.iter().filter_map(|c| c.keys.first()).collect();
    let mut all = schedule(chains, gated, workers, ahead, &|id, p| {
        nvcc::progress_line(
            cx.opts.progress,
            format_args!("pattern {id}: {} {}", p.rule_id(), p.shape_key()),
        );
        // A quick phase does not realize a smaller pattern no table holds: its kernels are in no
        // prefetch batch, so the sweep would compile alone after it (vit_b_16's plain
        // 6304x768x3072 GEMM, after its fused one lost to torch: 43 s of a 90 s first compose).
        // Its region runs torch's ops, as the fused pattern's measured faster, until the full
        // phase realizes it.
        if cx.quick && !own.contains(&ProblemKey::of(p)) && untabled(cx, sh, p) {
            let mut r = Realized::skipped(
                "a smaller pattern fallen back to that no table holds: the full phase (fact tune) sweeps it"
                    .into(),
            );
            r.cut = true;
            return Ok(r);
        }
        let mut r = realize(cx, sh, p, ahead)?;
        if matches!(r.how, Realization::Tuned { .. }) {
            swept.fetch_add(1, Ordering::Relaxed);
            if let Some(c) = countdown {
                c.swept(&format!("{} {}", p.rule_id(), p.shape_key()));
            }
        }
        // A winner slower than torch is left to torch here, so that its chain goes on to the
        // smaller pattern, which may still beat torch's ops.
        finish(cx.opts, &mut r);
        Ok(r)
    })?;
    all.swept = swept.into_inner();
    Ok(all)
}

/// Whether no table holds `p` itself: a sweep, or a neighbour's winner verified at its shape,
/// realizes it, either compiling kernels no prefetch batch held.
fn untabled(cx: RealizeCtx, sh: Shared, p: &Problem) -> bool {
    let Some(math) = p.math(cx.opts.precision) else {
        return false;
    };
    let key = TableKey::of(p, math, cx.opts.arch);
    !matches!(lock(sh.tables).lookup(&key, p), Lookup::Exact { .. })
}

/// `realize_all` over `realize_one`, on `workers` threads; `gated[i]`: chain i's first problem
/// waits for the sibling batch (`ahead`'s gate).
fn schedule(
    chains: &[Chain],
    gated: Vec<bool>,
    workers: usize,
    ahead: &Ahead,
    realize_one: &RealizeOne,
) -> Result<AllRealized, ComposeError> {
    let board = Board {
        chains,
        gated,
        taken: Mutex::new(vec![false; chains.len()]),
        states: Mutex::new(BTreeMap::new()),
        changed: Condvar::new(),
        error: Mutex::new(None),
        steps: Mutex::new(vec![0; chains.len()]),
    };
    std::thread::scope(|s| {
        for _ in 0..workers.max(1) {
            s.spawn(|| board.work(ahead, realize_one));
        }
    });
    if let Some(e) = board.error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    let done = board
        .states
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .filter_map(|(k, s)| match s {
            State::Done(slot) => Some((k, *slot)),
            _ => None,
        })
        .collect();
    Ok(AllRealized {
        done,
        steps: board.steps.into_inner().unwrap_or_else(|e| e.into_inner()),
        swept: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::gemm::{GemmLayout, GemmProblem};
    use crate::types::DType;

    /// A GEMM problem told apart by its M.
    fn p(m: i64) -> Problem {
        GemmProblem {
            m,
            n: 768,
            k: 768,
            layout: GemmLayout::Rcr,
            dtype: DType::Bf16,
            bias: false,
            batch: 1,
            epilogue: None,
            padded_from: None,
        }
        .into()
    }

    fn chain(id: &str, ms: &[i64]) -> Chain {
        let problems: Vec<Problem> = ms.iter().map(|&m| p(m)).collect();
        Chain {
            id: id.into(),
            keys: problems.iter().map(ProblemKey::of).collect(),
            falls: vec![("the fused epilogue", "the GEMM alone"); ms.len() - 1],
            problems,
        }
    }

    fn m_of(p: &Problem) -> i64 {
        p.get::<GemmProblem>().unwrap().m
    }

    fn tuned() -> Realized {
        Realized {
            how: Realization::Tuned {
                candidates: 1,
                failed: 0,
                quick: false,
            },
            entry: None,
            failures: vec![],
            cut: false,
            lost: None,
        }
    }

    /// Chains a…e: `a` and `d` share a sweep measured ahead (M 1); `c`'s fused problem (M 3)
    /// gets no kernel and falls back to `b`'s (M 2).
    fn chains() -> (Vec<Chain>, Vec<bool>) {
        (
            vec![
                chain("a", &[1]),
                chain("b", &[2]),
                chain("c", &[3, 2]),
                chain("d", &[1]),
                chain("e", &[4]),
            ],
            vec![true, false, false, true, false],
        )
    }

    #[test]
    fn while_the_sibling_batch_compiles_the_patterns_that_need_nothing_of_it_go_first() {
        let (chains, gated) = chains();
        let ahead = Ahead::default();
        ahead.siblings.close();
        let order = Mutex::new(Vec::new());
        let done = schedule(&chains, gated, 1, &ahead, &|_, p| {
            let mut order = lock(&order);
            order.push(m_of(p));
            assert!(
                ahead.siblings.is_open() || m_of(p) != 1,
                "a gated sweep started before its batch compiled"
            );
            if order.len() == 3 {
                // The batch ends while the third realization runs.
                ahead.siblings.open();
            }
            Ok(if m_of(p) == 3 {
                Realized::skipped("no candidate passed verification".into())
            } else {
                tuned()
            })
        })
        .unwrap();
        assert_eq!(*lock(&order), [2, 3, 4, 1], "each distinct problem once");
        assert_eq!(
            done.steps,
            [0, 0, 1, 0, 0],
            "c fell back once, to b's problem"
        );
        assert_eq!(done.done.len(), 4);
        assert!(done.done[&ProblemKey::of(&p(3))].skipped);
    }

    #[test]
    fn side_by_side_each_problem_is_realized_once_and_the_others_wait_for_it() {
        let (chains, gated) = chains();
        let ahead = Ahead::default();
        let calls = Mutex::new(BTreeMap::<i64, usize>::new());
        let running = Mutex::new((0usize, 0usize));
        let done = schedule(&chains, gated, 3, &ahead, &|_, p| {
            *lock(&calls).entry(m_of(p)).or_default() += 1;
            {
                let mut r = lock(&running);
                r.0 += 1;
                r.1 = r.1.max(r.0);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            lock(&running).0 -= 1;
            Ok(if m_of(p) == 3 {
                Realized::skipped("no kernel".into())
            } else {
                tuned()
            })
        })
        .unwrap();
        assert!(lock(&calls).values().all(|&n| n == 1), "{:?}", lock(&calls));
        assert_eq!(lock(&calls).len(), 4);
        assert_eq!(done.steps, [0, 0, 1, 0, 0]);
        assert!(lock(&running).1 > 1, "realizations ran side by side");
        assert!(lock(&running).1 <= 3, "never more than one per worker");
    }

    #[test]
    fn the_first_error_stops_the_realizations_not_yet_started() {
        let (chains, gated) = chains();
        let ahead = Ahead::default();
        let seen = Mutex::new(Vec::new());
        let e = schedule(&chains, gated, 1, &ahead, &|_, p| {
            lock(&seen).push(m_of(p));
            if m_of(p) == 2 {
                return Err(ComposeError::Tune {
                    key: "gemm_rcr 2x768x768".into(),
                    detail: "the tuning worker on GPU0 failed before judging any variant".into(),
                });
            }
            Ok(tuned())
        })
        .err()
        .expect("the error comes back");
        assert!(e.to_string().contains("GPU0"), "{e}");
        assert_eq!(*lock(&seen), [1, 2], "nothing started after the error");
    }
}
