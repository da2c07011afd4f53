use super::super::fake::{fake_pool, gpu, request, FakeGpus};
use super::*;

fn sm90(g: &Gpu) -> bool {
    g.capability == (9, 0)
}

#[test]
fn gpus_are_a_count_a_list_or_all() {
    assert_eq!("all".parse(), Ok(GpuChoice::All));
    assert_eq!("2".parse(), Ok(GpuChoice::Count(2)));
    assert_eq!("0,1".parse(), Ok(GpuChoice::List(vec![0, 1])));
    assert_eq!("1,".parse(), Ok(GpuChoice::List(vec![1])));
    assert_eq!(" 3, 1,3".parse(), Ok(GpuChoice::List(vec![3, 1])));
    let zero = "0".parse::<GpuChoice>().unwrap_err();
    assert!(zero.contains("--gpus 0,"), "{zero}");
    for bad in ["", "two", "0,x", ",", "-1"] {
        let e = bad.parse::<GpuChoice>().unwrap_err();
        assert!(e.contains("--gpus"), "{bad}: {e}");
    }
}

#[test]
fn a_worker_is_pinned_by_this_process_own_entry() {
    assert_eq!(pin(1, None), "1");
    assert_eq!(pin(1, Some("4,6")), "6");
    assert_eq!(pin(0, Some("GPU-ab, GPU-cd")), "GPU-ab");
    // A list shorter than the devices CUDA reports cannot be: fall back to the ordinal.
    assert_eq!(pin(2, Some("4,6")), "2");
}

#[test]
fn the_choice_picks_among_gpus_of_one_model_that_run_the_target() {
    let here = [
        gpu(0, "H100", (9, 0)),
        gpu(1, "A10", (8, 6)),
        gpu(2, "H100", (9, 0)),
        gpu(3, "H200", (9, 0)),
    ];
    let indices = |v: &[Gpu]| v.iter().map(|g| g.index).collect::<Vec<_>>();
    let (all, notes) = select(&GpuChoice::All, &here, sm90).unwrap();
    assert_eq!(indices(&all), [0, 2]);
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(notes
        .iter()
        .any(|n| n.starts_with("GPU1") && n.contains("8.6")));
    assert!(notes
        .iter()
        .any(|n| n.starts_with("GPU3") && n.contains("another model")));
    let (one, _) = select(&GpuChoice::Count(1), &here, sm90).unwrap();
    assert_eq!(indices(&one), [0]);
    let e = select(&GpuChoice::Count(3), &here, sm90).unwrap_err();
    assert!(e.contains("--gpus 2"), "{e}");
    let (listed, notes) = select(&GpuChoice::List(vec![2, 0]), &here, sm90).unwrap();
    assert_eq!(indices(&listed), [2, 0]);
    assert!(notes.is_empty(), "{notes:?}");
    for (list, says) in [
        (vec![1], "does not run"),
        (vec![0, 3], "different models"),
        (vec![7], "no GPU 7"),
    ] {
        let e = select(&GpuChoice::List(list), &here, sm90).unwrap_err();
        assert!(e.contains(says), "{e}");
    }
    // No GPU that tunes: nothing picked, as on a machine without a GPU.
    let (none, _) = select(&GpuChoice::All, &here[1..2], sm90).unwrap();
    assert!(none.is_empty());
    assert!(select(&GpuChoice::Count(2), &[], sm90)
        .unwrap()
        .0
        .is_empty());
}

#[test]
fn dealing_is_round_robin_and_loses_nothing() {
    assert_eq!(deal(&[0, 1, 2, 3, 4], 2), [vec![0, 2, 4], vec![1, 3]]);
    assert_eq!(deal(&[7], 3), [vec![7], vec![], vec![]]);
    assert_eq!(deal(&[5, 6], 0), [vec![5, 6]]);
}

fn timed_ms(r: &GpuResult, variant: usize) -> Option<f64> {
    r.result
        .outcomes
        .iter()
        .find(|(i, _)| *i == variant)
        .and_then(|(_, o)| o.median_ms())
}

#[test]
fn a_measurement_deals_every_variant_once_across_the_gpus_each_with_its_own_baseline() {
    let kernels: Vec<Option<f64>> = (0..8).map(|i| Some(1.0 + i as f64 * 0.1)).collect();
    let slowdown = vec![1.0, 1.5, 1.0];
    let (pool, fake) = fake_pool(FakeGpus::new(kernels, 2.0, slowdown.clone()));
    let done = Mutex::new(Vec::new());
    let dealt = Mutex::new(Vec::new());
    let results = pool
        .measure(
            &request((0..8).collect()),
            &|d| {
                dealt
                    .lock()
                    .unwrap()
                    .extend(d.iter().map(|(g, n)| (g.index, *n)))
            },
            &|i| done.lock().unwrap().push(i),
        )
        .unwrap();
    assert_eq!(*dealt.lock().unwrap(), [(0, 3), (1, 3), (2, 2)]);
    let hands: Vec<(usize, Vec<usize>)> = results
        .iter()
        .map(|r| (r.gpu.index, r.variants.clone()))
        .collect();
    assert_eq!(
        hands,
        [(0, vec![0, 3, 6]), (1, vec![1, 4, 7]), (2, vec![2, 5])]
    );
    let mut timed: Vec<usize> = fake.timed.lock().unwrap().iter().map(|t| t.1).collect();
    timed.sort();
    assert_eq!(
        timed,
        (0..8).collect::<Vec<_>>(),
        "every variant timed exactly once"
    );
    let mut heard = done.into_inner().unwrap();
    heard.sort();
    assert_eq!(heard, (0..8).collect::<Vec<_>>());
    for r in &results {
        let b = r
            .result
            .baseline
            .as_ref()
            .expect("each worker times torch")
            .median_ms;
        assert_eq!(
            b,
            2.0 * slowdown[r.gpu.index],
            "torch timed on {}",
            r.gpu.label()
        );
        for &v in &r.variants {
            let ms = timed_ms(r, v).unwrap();
            assert!((ms / b - (1.0 + v as f64 * 0.1) / 2.0).abs() < 1e-12);
        }
    }
    assert_eq!(fake.most_at_once(), 1);
}

#[test]
fn a_crash_costs_only_its_variant_and_the_gpu_goes_on_in_a_fresh_worker() {
    use super::super::Outcome;
    let kernels = vec![Some(1.0), Some(1.1), None, Some(0.9), Some(1.2), Some(0.8)];
    let mut fake = FakeGpus::new(kernels, 1.0, vec![1.0, 1.0]);
    // GPU1's hand is 1, 3, 5: its worker dies on 3.
    fake.crashes = vec![(1, 3)];
    let (pool, fake) = fake_pool(fake);
    let results = pool
        .measure(&request((0..6).collect()), &|_| {}, &|_| {})
        .unwrap();
    let outcome = |v: usize| {
        results
            .iter()
            .flat_map(|r| r.result.outcomes.iter())
            .filter(|(i, _)| *i == v)
            .map(|(_, o)| o.clone())
            .collect::<Vec<_>>()
    };
    for v in 0..6 {
        assert_eq!(outcome(v).len(), 1, "variant {v} judged once");
    }
    assert!(
        matches!(&outcome(3)[0], Outcome::Fault { error } if error.contains("SIGSEGV")),
        "{:?}",
        outcome(3)
    );
    assert_eq!(outcome(2)[0].label(), "numeric");
    for v in [0, 1, 4, 5] {
        assert_eq!(outcome(v)[0].label(), "ok", "variant {v}");
    }
    let spawned = fake.spawned.lock().unwrap().clone();
    let on1: Vec<Vec<usize>> = spawned
        .iter()
        .filter(|(d, _)| *d == 1)
        .map(|(_, v)| v.clone())
        .collect();
    assert_eq!(
        on1,
        [vec![1, 3, 5], vec![5]],
        "resumed after the fault, on its GPU"
    );
    // The baseline survives the crash: the fresh worker does not time torch again.
    assert!(results[1].result.baseline.is_some());
}

#[test]
fn a_worker_that_judges_nothing_fails_the_measurement_naming_its_gpu() {
    struct Broken;
    impl Spawn for Broken {
        fn run(
            &self,
            _: &Gpu,
            _: &Request,
            _: &mut dyn FnMut(super::super::worker::Event),
        ) -> Result<(), String> {
            Err("worker exited with exit status: 1: cannot open the library".into())
        }
    }
    let pool = Pool::new(vec![gpu(0, "H100", (9, 0))], Box::new(Broken));
    let e = pool
        .measure(&request(vec![0, 1]), &|_| {}, &|_| {})
        .unwrap_err();
    assert!(
        e.contains("GPU0") && e.contains("cannot open the library"),
        "{e}"
    );
}

#[test]
fn measurements_side_by_side_share_the_gpus_one_worker_each_and_deal_alike_when_idle() {
    let kernels: Vec<Option<f64>> = (0..6).map(|i| Some(1.0 + i as f64)).collect();
    let mut fake = FakeGpus::new(kernels, 3.0, vec![1.0, 1.0]);
    fake.pause = std::time::Duration::from_millis(5);
    let (pool, fake) = fake_pool(fake);
    let all: Vec<Vec<GpuResult>> = std::thread::scope(|s| {
        let t: Vec<_> = (0..4)
            .map(|_| s.spawn(|| pool.measure(&request((0..6).collect()), &|_| {}, &|_| {})))
            .collect();
        t.into_iter().map(|t| t.join().unwrap().unwrap()).collect()
    });
    assert_eq!(fake.most_at_once(), 1, "never two workers on one GPU");
    for results in &all {
        let mut judged: Vec<usize> = results
            .iter()
            .flat_map(|r| r.result.outcomes.iter().map(|(i, _)| *i))
            .collect();
        judged.sort();
        assert_eq!(judged, (0..6).collect::<Vec<_>>());
    }
    assert_eq!(fake.timed.lock().unwrap().len(), 24);
    // On an idle pool the same measurement deals the same hands, with the same figures.
    let once = |pool: &Pool| {
        pool.measure(&request((0..6).collect()), &|_| {}, &|_| {})
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r.gpu.index,
                    r.variants.clone(),
                    format!("{:?}", r.result.outcomes),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(once(&pool), once(&pool));
}
