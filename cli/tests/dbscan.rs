//! `simjoin dbscan` end to end: .npy and .csv labels equal the library's `simjoin::dbscan`,
//! --stats is one JSON object with the counts, text and f32 inputs, the summary line, and a
//! clear one-line error for bad input.

use simjoin::{Backend, Dataset, DbscanOptions, Engine, Metric};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_simjoin");

fn scratch(test: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("simjoin-cli-dbscan-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("cannot run simjoin")
}

fn stdout_ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "simjoin failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn assert_error(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure");
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "not one line: {stderr}"
    );
    assert!(stderr.starts_with("simjoin: error: "), "{stderr}");
    assert!(
        stderr.contains(needle),
        "stderr {stderr:?} lacks {needle:?}"
    );
}

/// Three blobs and a uniform background, 2-D, deterministic.
fn blobs(n: usize) -> Vec<f64> {
    let mut s = 7u64;
    let mut unit = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut v = Vec::with_capacity(2 * n);
    for i in 0..n {
        let c = (i % 4) as f64 * 0.3;
        for _ in 0..2 {
            v.push(if i % 4 == 3 {
                unit()
            } else {
                c + 0.08 * unit()
            });
        }
    }
    v
}

fn write_npy<T: npyz::Serialize + npyz::AutoSerialize + Copy>(path: &Path, data: &[T], dim: u64) {
    use npyz::WriterBuilder;
    let mut w = npyz::WriteOptions::<T>::new()
        .default_dtype()
        .shape(&[data.len() as u64 / dim, dim])
        .writer(std::fs::File::create(path).unwrap())
        .begin_nd()
        .unwrap();
    w.extend(data.iter().copied()).unwrap();
    w.finish().unwrap();
}

fn expected(x: &[f64], eps: f64, min_samples: usize, metric: Metric) -> simjoin::DbscanResult {
    let data = Dataset::from_f64(x, 2).unwrap();
    let mut o = DbscanOptions::new(eps, min_samples);
    o.metric = metric;
    o.backend = Backend::Cpu;
    simjoin::dbscan(&Engine::new(), &data, &o).unwrap()
}

#[test]
fn npy_and_csv_labels_equal_the_library() {
    let dir = scratch("labels");
    let x = blobs(1200);
    write_npy(&dir.join("x.npy"), &x, 2);
    for (metric, min_samples) in [("euclidean", "5"), ("manhattan", "3"), ("chebyshev", "12")] {
        let want = expected(
            &x,
            0.02,
            min_samples.parse().unwrap(),
            metric.parse().unwrap(),
        );
        assert!(want.clusters >= 2 && want.noise > 0, "a dull case");
        let args = [
            "dbscan",
            "x.npy",
            "--eps",
            "0.02",
            "--min-samples",
            min_samples,
            "--metric",
            metric,
        ];
        stdout_ok(&run(&dir, &[&args[..], &["-o", "l.npy"]].concat()));
        let bytes = std::fs::read(dir.join("l.npy")).unwrap();
        let npy = npyz::NpyFile::new(&bytes[..]).unwrap();
        assert_eq!(npy.shape(), &[1200]);
        assert_eq!(npy.into_vec::<i64>().unwrap(), want.labels, "{metric}");
        stdout_ok(&run(&dir, &[&args[..], &["-o", "l.csv"]].concat()));
        let text = std::fs::read_to_string(dir.join("l.csv")).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("label"));
        let got: Vec<i64> = lines.map(|l| l.parse().unwrap()).collect();
        assert_eq!(got, want.labels, "{metric}");
        // --stats: one JSON object with the counts.
        let out = stdout_ok(&run(&dir, &[&args[..], &["--stats"]].concat()));
        let stats: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(stats["clusters"], want.clusters);
        assert_eq!(stats["noise_points"], want.noise);
        assert_eq!(stats["core_points"], want.core_points);
        assert_eq!(stats["points"], 1200);
        assert_eq!(stats["pairs"], want.report.pairs);
        assert_eq!(stats["backend"], "cpu");
        assert!(stats["seconds"].as_f64().unwrap() >= 0.0);
        // Without -o or --stats: one summary line.
        let out = stdout_ok(&run(&dir, &args));
        assert!(
            out.starts_with(&format!(
                "{} clusters, {} noise points, {} core points of 1200",
                want.clusters, want.noise, want.core_points
            )),
            "{out}"
        );
    }
}

#[test]
fn text_and_f32_inputs() {
    let dir = scratch("text");
    let x = blobs(400);
    let text: String = x
        .chunks(2)
        .map(|r| format!("{:?} {:?}\n", r[0], r[1]))
        .collect();
    std::fs::write(dir.join("x.txt"), text).unwrap();
    let want = expected(&x, 0.03, 4, Metric::Euclidean);
    stdout_ok(&run(
        &dir,
        &[
            "dbscan",
            "x.txt",
            "--eps",
            "0.03",
            "--min-samples",
            "4",
            "-o",
            "l.csv",
        ],
    ));
    let text = std::fs::read_to_string(dir.join("l.csv")).unwrap();
    let got: Vec<i64> = text.lines().skip(1).map(|l| l.parse().unwrap()).collect();
    assert_eq!(got, want.labels);
    // f32 input is clustered in f32.
    let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    write_npy(&dir.join("x32.npy"), &x32, 2);
    let data = Dataset::from_f32(&x32, 2).unwrap();
    let want = simjoin::dbscan(&Engine::new(), &data, &DbscanOptions::new(0.03, 4)).unwrap();
    let out = stdout_ok(&run(
        &dir,
        &[
            "dbscan",
            "x32.npy",
            "--eps",
            "0.03",
            "--min-samples",
            "4",
            "--stats",
        ],
    ));
    let stats: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(stats["clusters"], want.clusters);
    assert_eq!(stats["noise_points"], want.noise);
}

#[test]
fn tiny_inputs() {
    let dir = scratch("tiny");
    std::fs::write(dir.join("one.csv"), "1.0,2.0\n").unwrap();
    let out = stdout_ok(&run(
        &dir,
        &[
            "dbscan",
            "one.csv",
            "--eps",
            "1",
            "--min-samples",
            "1",
            "-o",
            "l.csv",
        ],
    ));
    // One line says what was done.
    assert!(
        out.starts_with("1 clusters, 0 noise points, 1 core points of 1 in ")
            && out.trim_end().ends_with("; labels written to l.csv"),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("l.csv")).unwrap(),
        "label\n0\n"
    );
    std::fs::write(dir.join("two.csv"), "0,0\n0.5,0\n").unwrap();
    stdout_ok(&run(
        &dir,
        &[
            "dbscan",
            "two.csv",
            "--eps",
            "1",
            "--min-samples",
            "2",
            "-o",
            "l.csv",
        ],
    ));
    assert_eq!(
        std::fs::read_to_string(dir.join("l.csv")).unwrap(),
        "label\n0\n0\n"
    );
}

/// --sample-weight (1-D .npy or one value per line): the labels of the library's
/// `dbscan_weighted`; a wrong count or a NaN weight is one clear line.
#[test]
fn sample_weights() {
    let dir = scratch("weights");
    let x = blobs(1500);
    write_npy(&dir.join("x.npy"), &x, 2);
    let w: Vec<f64> = (0..1500)
        .map(|i| [0.0, 0.5, 1.0, 2.0, -1.0][i % 5])
        .collect();
    let file = std::fs::File::create(dir.join("w.npy")).unwrap();
    {
        use npyz::WriterBuilder;
        let mut out = npyz::WriteOptions::<f64>::new()
            .default_dtype()
            .shape(&[w.len() as u64])
            .writer(std::io::BufWriter::new(file))
            .begin_nd()
            .unwrap();
        out.extend(w.iter().copied()).unwrap();
        out.finish().unwrap();
    }
    let text: String = w.iter().map(|v| format!("{v}\n")).collect();
    std::fs::write(dir.join("w.csv"), text).unwrap();
    let data = Dataset::from_f64(&x, 2).unwrap();
    let opts = DbscanOptions {
        backend: Backend::Cpu,
        ..DbscanOptions::new(0.03, 4)
    };
    let want = simjoin::dbscan_weighted(&Engine::new(), &data, &opts, Some(&w)).unwrap();
    assert_ne!(want.labels, expected(&x, 0.03, 4, Metric::Euclidean).labels);
    for weights in ["w.npy", "w.csv"] {
        stdout_ok(&run(
            &dir,
            &[
                "dbscan",
                "x.npy",
                "--eps",
                "0.03",
                "--min-samples",
                "4",
                "--backend",
                "cpu",
                "--sample-weight",
                weights,
                "-o",
                "l.npy",
            ],
        ));
        let labels: Vec<i64> = npyz::NpyFile::new(std::fs::File::open(dir.join("l.npy")).unwrap())
            .unwrap()
            .into_vec()
            .unwrap();
        assert_eq!(labels, want.labels, "{weights}");
    }
    std::fs::write(dir.join("short.csv"), "1\n2\n").unwrap();
    let out = run(
        &dir,
        &[
            "dbscan",
            "x.npy",
            "--eps",
            "0.03",
            "--sample-weight",
            "short.csv",
        ],
    );
    assert_error(&out, "sample_weight has 2 entries");
    std::fs::write(dir.join("nan.csv"), "1\nnan\n".repeat(750)).unwrap();
    let out = run(
        &dir,
        &[
            "dbscan",
            "x.npy",
            "--eps",
            "0.03",
            "--sample-weight",
            "nan.csv",
        ],
    );
    assert_error(&out, "sample_weight[1]");
}

#[test]
fn bad_input_is_one_clear_line() {
    let dir = scratch("bad");
    std::fs::write(dir.join("x.csv"), "0,0\n1,1\n").unwrap();
    std::fs::write(dir.join("nan.csv"), "0,0\nnan,1\n").unwrap();
    for (args, needle) in [
        (vec!["--eps", "0"], "eps must be a finite number > 0"),
        (vec!["--eps", "-1"], "eps must be a finite number > 0"),
        (vec!["--eps", "nan"], "eps must be a finite number > 0"),
        (
            vec!["--eps", "1", "--min-samples", "0"],
            "--min-samples must be at least 1",
        ),
        (
            vec!["--eps", "1", "--min-samples", "-3"],
            "--min-samples must be at least 1",
        ),
        (
            vec!["--eps", "1", "-o", "l.txt"],
            "unknown labels format '.txt'",
        ),
    ] {
        let out = run(&dir, &[&["dbscan", "x.csv"][..], &args[..]].concat());
        assert_error(&out, needle);
    }
    assert_error(
        &run(&dir, &["dbscan", "nan.csv", "--eps", "1"]),
        "not finite",
    );
    assert_error(
        &run(&dir, &["dbscan", "missing.npy", "--eps", "1"]),
        "missing.npy",
    );
}

/// Every `simjoin ...` line of docs/cli.md's DBSCAN example runs as written (cli.rs checks
/// what they print), and the label files are what they should be.
#[test]
fn docs_dbscan_example_runs() {
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md"))
            .unwrap();
    let block = page
        .split("<!-- dbscan-cli-example -->")
        .nth(1)
        .and_then(|rest| rest.split("```sh\n").nth(1))
        .and_then(|rest| rest.split("```").next())
        .expect("docs/cli.md has a ```sh block after <!-- dbscan-cli-example -->");
    let dir = scratch("docs");
    let mut ran = 0;
    for line in block.lines().filter(|l| l.starts_with("simjoin ")) {
        let command = line.split('#').next().unwrap();
        let args: Vec<&str> = command.split_whitespace().skip(1).collect();
        stdout_ok(&run(&dir, &args));
        ran += 1;
    }
    assert_eq!(ran, 4);
    let bytes = std::fs::read(dir.join("labels.npy")).unwrap();
    let labels: Vec<i64> = npyz::NpyFile::new(&bytes[..]).unwrap().into_vec().unwrap();
    assert_eq!(labels.len(), 20000);
    assert!(labels.iter().any(|&l| l >= 1) && labels.contains(&-1));
    let csv = std::fs::read_to_string(dir.join("labels.csv")).unwrap();
    assert_eq!(csv.lines().count(), 20001);
}
