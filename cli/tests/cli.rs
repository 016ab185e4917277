//! The `simjoin` command end to end: every input format, both output formats, --stats, A ⋈ B,
//! the demo, the commands of the README and docs/cli.md, and a clear one-line error for every
//! kind of bad input. Pair sets are compared exactly with the brute-force oracle.

use simjoin::{oracle, Dataset, Metric, Pair};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_simjoin");

/// A fresh scratch directory per test.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("simjoin-cli-{}-{test}", std::process::id()));
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

/// Asserts a clean failure: non-zero exit, one line on stderr naming the problem, no panic.
fn assert_error(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure, got success; stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
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

fn lcg_points(n: usize, dim: usize, seed: u64) -> Vec<f64> {
    let mut s = seed;
    (0..n * dim)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 11) as f64 / (1u64 << 53) as f64
        })
        .collect()
}

/// Rows as text, every number in Rust's shortest round-trip form (so parsing is exact).
fn to_text(points: &[f64], dim: usize, sep: &str) -> String {
    points
        .chunks(dim)
        .map(|r| {
            r.iter()
                .map(|x| format!("{x:?}"))
                .collect::<Vec<_>>()
                .join(sep)
                + "\n"
        })
        .collect()
}

fn read_npy_pairs(path: &Path) -> Vec<Pair> {
    let bytes = std::fs::read(path).unwrap();
    let npy = npyz::NpyFile::new(&bytes[..]).unwrap();
    assert_eq!(npy.shape().len(), 2);
    assert_eq!(npy.shape()[1], 2);
    let flat: Vec<u32> = npy.into_vec().unwrap();
    flat.chunks(2).map(|c| [c[0], c[1]]).collect()
}

fn read_csv_pairs(path: &Path) -> Vec<Pair> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("i,j"));
    lines
        .map(|l| {
            let (i, j) = l.split_once(',').unwrap();
            [i.parse().unwrap(), j.parse().unwrap()]
        })
        .collect()
}

fn write_npy<T: npyz::Serialize + npyz::AutoSerialize + Copy>(
    path: &Path,
    data: &[T],
    shape: &[u64],
    fortran: bool,
) {
    use npyz::WriterBuilder;
    let mut opts = npyz::WriteOptions::<T>::new().default_dtype().shape(shape);
    if fortran {
        opts = opts.order(npyz::Order::Fortran);
    }
    let mut w = opts
        .writer(std::fs::File::create(path).unwrap())
        .begin_nd()
        .unwrap();
    w.extend(data.iter().copied()).unwrap();
    w.finish().unwrap();
}

#[test]
fn csv_with_header_to_npy_matches_oracle() {
    let dir = scratch("csv");
    let pts = lcg_points(400, 2, 1);
    std::fs::write(
        dir.join("in.csv"),
        format!("x,y\n{}", to_text(&pts, 2, ", ")),
    )
    .unwrap();
    let want = oracle::self_join(
        &Dataset::from_f64(&pts, 2).unwrap(),
        Metric::Euclidean,
        0.05,
    );
    assert!(want.len() > 100);
    stdout_ok(&run(
        &dir,
        &[
            "self-join",
            "in.csv",
            "--eps",
            "0.05",
            "--output",
            "out.npy",
        ],
    ));
    assert_eq!(read_npy_pairs(&dir.join("out.npy")), want); // sorted, exactly
    let count = stdout_ok(&run(&dir, &["self-join", "in.csv", "--eps", "0.05"]));
    assert_eq!(count.trim(), want.len().to_string());
}

#[test]
fn whitespace_txt_every_metric_to_csv() {
    let dir = scratch("txt");
    let pts = lcg_points(300, 3, 2);
    std::fs::write(dir.join("in.txt"), to_text(&pts, 3, " \t ")).unwrap();
    let data = Dataset::from_f64(&pts, 3).unwrap();
    for metric in [Metric::Euclidean, Metric::Manhattan, Metric::Chebyshev] {
        let want = oracle::self_join(&data, metric, 0.1);
        let out = run(
            &dir,
            &[
                "self-join",
                "in.txt",
                "--eps",
                "0.1",
                "--metric",
                metric.name(),
                "-o",
                "out.csv",
            ],
        );
        stdout_ok(&out);
        assert_eq!(read_csv_pairs(&dir.join("out.csv")), want, "{metric}");
    }
}

#[test]
fn npy_f32_f64_and_fortran_order() {
    let dir = scratch("npy");
    let pts = lcg_points(300, 4, 3);
    let pts32: Vec<f32> = pts.iter().map(|&x| x as f32).collect();
    write_npy(&dir.join("f64.npy"), &pts, &[300, 4], false);
    write_npy(&dir.join("f32.npy"), &pts32, &[300, 4], false);
    // The same points stored column-major.
    let col_major: Vec<f64> = (0..4)
        .flat_map(|c| (0..300).map(move |r| (r, c)))
        .map(|(r, c)| pts[r * 4 + c])
        .collect();
    write_npy(&dir.join("fortran.npy"), &col_major, &[300, 4], true);
    let want64 = oracle::self_join(
        &Dataset::from_f64(&pts, 4).unwrap(),
        Metric::Euclidean,
        0.15,
    );
    let want32 = oracle::self_join(
        &Dataset::from_f32(&pts32, 4).unwrap(),
        Metric::Euclidean,
        0.15,
    );
    // float16: read and joined as its exact f32 widening.
    let pts16: Vec<half::f16> = pts.iter().map(|&x| half::f16::from_f64(x)).collect();
    write_npy(&dir.join("f16.npy"), &pts16, &[300, 4], false);
    let widened: Vec<f32> = pts16.iter().map(|v| v.to_f32()).collect();
    let want16 = oracle::self_join(
        &Dataset::from_f32(&widened, 4).unwrap(),
        Metric::Euclidean,
        0.15,
    );
    assert_ne!(want16, want32, "float16's rounding moves some pairs");
    // Big-endian copies ('>f8', '>f4', '>f2': NumPy writes them on request).
    for (file, width) in [("f64", 8), ("f32", 4), ("f16", 2)] {
        let (magic, text, data) = npy_parts(&dir.join(format!("{file}.npy")));
        let mut out = [&magic[..], text.replacen("'<f", "'>f", 1).as_bytes()].concat();
        data.chunks_exact(width)
            .for_each(|v| out.extend(v.iter().rev()));
        std::fs::write(dir.join(format!("{file}-be.npy")), out).unwrap();
    }
    for (file, want) in [
        ("f64.npy", &want64),
        ("f32.npy", &want32),
        ("f16.npy", &want16),
        ("fortran.npy", &want64),
        ("f64-be.npy", &want64),
        ("f32-be.npy", &want32),
        ("f16-be.npy", &want16),
    ] {
        stdout_ok(&run(
            &dir,
            &["self-join", file, "--eps", "0.15", "-o", "out.npy"],
        ));
        assert_eq!(&read_npy_pairs(&dir.join("out.npy")), want, "{file}");
    }
    // --precision f32 on f64 input gives the f32 answer.
    stdout_ok(&run(
        &dir,
        &[
            "self-join",
            "f64.npy",
            "--eps",
            "0.15",
            "--precision",
            "f32",
            "-o",
            "out.npy",
        ],
    ));
    assert_eq!(read_npy_pairs(&dir.join("out.npy")), want32);
    // A file shorter than its header's shape says, and a shape far past the file's size
    // (refused before any buffer is allocated): clear errors.
    let (magic, text, data) = npy_parts(&dir.join("f64.npy"));
    let short = [&magic[..], text.as_bytes(), &data[..data.len() - 8]].concat();
    std::fs::write(dir.join("short.npy"), short).unwrap();
    let huge =
        text.replacen("(300, 4", "(300000000000000, 4", 1)
            .replacen("            \n", "\n", 1);
    assert_eq!(huge.len(), text.len(), "{text:?}");
    let huge = [&magic[..], huge.as_bytes(), &data[..]].concat();
    std::fs::write(dir.join("huge.npy"), huge).unwrap();
    for (file, says) in [("short.npy", "ends before"), ("huge.npy", "too short")] {
        let out = run(&dir, &["self-join", file, "--eps", "0.15"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{file}: {err}");
    }
}

/// A version 1.0 .npy file's magic and header length, header text, and data bytes.
fn npy_parts(path: &Path) -> (Vec<u8>, String, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
    let end = 10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let text = String::from_utf8(bytes[10..end].to_vec()).unwrap();
    (bytes[..10].to_vec(), text, bytes[end..].to_vec())
}

#[test]
fn fvecs_input() {
    let dir = scratch("fvecs");
    let pts: Vec<f32> = lcg_points(200, 5, 4).iter().map(|&x| x as f32).collect();
    let mut bytes = Vec::new();
    for row in pts.chunks(5) {
        bytes.extend_from_slice(&5i32.to_le_bytes());
        row.iter()
            .for_each(|x| bytes.extend_from_slice(&x.to_le_bytes()));
    }
    std::fs::write(dir.join("in.fvecs"), &bytes).unwrap();
    let want = oracle::self_join(&Dataset::from_f32(&pts, 5).unwrap(), Metric::Euclidean, 0.3);
    stdout_ok(&run(
        &dir,
        &["self-join", "in.fvecs", "--eps", "0.3", "-o", "out.npy"],
    ));
    assert_eq!(read_npy_pairs(&dir.join("out.npy")), want);
    // A truncated file is an error.
    std::fs::write(dir.join("cut.fvecs"), &bytes[..bytes.len() - 3]).unwrap();
    assert_error(
        &run(&dir, &["self-join", "cut.fvecs", "--eps", "0.3"]),
        "truncated",
    );
}

#[test]
fn join_a_b_with_stats() {
    let dir = scratch("join");
    let a = lcg_points(250, 2, 5);
    let b = lcg_points(150, 2, 6);
    std::fs::write(dir.join("a.csv"), to_text(&a, 2, ",")).unwrap();
    std::fs::write(dir.join("b.csv"), to_text(&b, 2, ",")).unwrap();
    let want = oracle::join(
        &Dataset::from_f64(&a, 2).unwrap(),
        &Dataset::from_f64(&b, 2).unwrap(),
        Metric::Euclidean,
        0.05,
    );
    let out = stdout_ok(&run(
        &dir,
        &[
            "join",
            "a.csv",
            "b.csv",
            "--eps",
            "0.05",
            "--backend",
            "cpu",
            "-o",
            "out.csv",
            "--stats",
        ],
    ));
    assert_eq!(read_csv_pairs(&dir.join("out.csv")), want);
    let stats: serde_json::Value =
        serde_json::from_str(out.trim()).expect("--stats prints one JSON object");
    assert_eq!(stats["pairs"], want.len());
    assert_eq!(stats["backend"], "cpu");
    assert_eq!(stats["points"], serde_json::json!([250, 150]));
    assert!(stats["seconds"].as_f64().unwrap() >= 0.0);
    assert!(stats["batches"].as_u64().unwrap() >= 1);
    assert!(stats["device"].is_string() && stats["phases"].is_array());
    assert_ne!(stats["algorithm"], "auto");
}

/// Sorted output from a GPU (lavapipe under tests/run.sh) with `SIMJOIN_GPU_ROWS=1` comes
/// from the engine's rows sorted on the device, written in order: the oracle's pairs,
/// self-join and A ⋈ B, and --stats says so; with the sort's memory too small for them, the
/// external sort instead; without the variable (the default), the host's sort.
#[test]
fn gpu_sorted_output_is_sorted_on_the_device() {
    if std::env::var_os("VK_DRIVER_FILES").is_none() {
        return; // no pinned Vulkan driver (tests/run.sh pins lavapipe)
    }
    let dir = scratch("gpu-rows");
    let a = lcg_points(400, 2, 15);
    let b = lcg_points(300, 2, 16);
    std::fs::write(dir.join("a.csv"), to_text(&a, 2, ",")).unwrap();
    std::fs::write(dir.join("b.csv"), to_text(&b, 2, ",")).unwrap();
    let (da, db) = (
        Dataset::from_f64(&a, 2).unwrap(),
        Dataset::from_f64(&b, 2).unwrap(),
    );
    for (args, want, device) in [
        (
            vec!["self-join", "a.csv"],
            oracle::self_join(&da, Metric::Euclidean, 0.06),
            true,
        ),
        (
            vec!["self-join", "a.csv", "--default-rows"],
            oracle::self_join(&da, Metric::Euclidean, 0.06),
            false,
        ),
        (
            vec!["join", "a.csv", "b.csv"],
            oracle::join(&da, &db, Metric::Euclidean, 0.06),
            true,
        ),
        (
            vec!["self-join", "a.csv", "--sort-memory", "1K"],
            oracle::self_join(&da, Metric::Euclidean, 0.06),
            false,
        ),
    ] {
        let mut args = args.clone();
        // "--default-rows" (this test's marker, not the CLI's): SIMJOIN_GPU_ROWS unset.
        let rows = !args.contains(&"--default-rows");
        args.retain(|a| *a != "--default-rows");
        args.extend([
            "--eps",
            "0.06",
            "--backend",
            "gpu",
            "-o",
            "out.npy",
            "--stats",
        ]);
        let mut command = Command::new(BIN);
        command
            .args(&args)
            .current_dir(&dir)
            .env_remove("SIMJOIN_GPU_ROWS");
        if rows {
            command.env("SIMJOIN_GPU_ROWS", "1");
        }
        let out = stdout_ok(&command.output().expect("cannot run simjoin"));
        assert!(want.len() > 100);
        assert_eq!(read_npy_pairs(&dir.join("out.npy")), want, "{args:?}");
        let stats: serde_json::Value =
            serde_json::from_str(out.trim()).expect("--stats prints one JSON object");
        let notes = stats["notes"].to_string();
        assert_eq!(
            notes.contains("sorted on the device"),
            device,
            "{args:?}: {notes}"
        );
    }
}

#[test]
fn tiny_inputs_and_exact_boundary() {
    let dir = scratch("tiny");
    std::fs::write(dir.join("empty.csv"), "").unwrap();
    std::fs::write(dir.join("one.csv"), "0.5,0.5\n").unwrap();
    // Exactly eps = 0.25 apart (dyadic, exact); and a pair just beyond.
    std::fs::write(dir.join("two.csv"), "0.5,0.5\n0.75,0.5\n").unwrap();
    std::fs::write(dir.join("far.csv"), "0.5,0.5\n0.7500001,0.5\n").unwrap();
    for (file, want) in [
        ("empty.csv", "0"),
        ("one.csv", "0"),
        ("two.csv", "1"),
        ("far.csv", "0"),
    ] {
        let out = stdout_ok(&run(&dir, &["self-join", file, "--eps", "0.25"]));
        assert_eq!(out.trim(), want, "{file}");
    }
}

#[test]
fn bad_input_is_one_clear_line() {
    let dir = scratch("bad");
    std::fs::write(dir.join("ok.csv"), "1,2\n3,4\n").unwrap();
    std::fs::write(dir.join("malformed.csv"), "1,2\n3,abc\n").unwrap();
    std::fs::write(dir.join("ragged.csv"), "1,2\n3,4,5\n").unwrap();
    std::fs::write(dir.join("nan.csv"), "1,2\nnan,4\n").unwrap();
    std::fs::write(dir.join("inf.txt"), "1 2\n3 inf\n").unwrap();
    std::fs::write(dir.join("three.csv"), "1,2,3\n").unwrap();
    std::fs::write(dir.join("data.xyz"), "1,2\n").unwrap();
    std::fs::write(dir.join("far.csv"), "0,0\n1e300,1e300\n").unwrap();
    write_npy(&dir.join("flat.npy"), &[1.0f64, 2.0, 3.0], &[3], false);
    write_npy(&dir.join("ints.npy"), &[1i32, 2, 3, 4], &[2, 2], false);
    let cases: &[(&[&str], &str)] = &[
        (
            &["self-join", "missing.csv", "--eps", "1"],
            "cannot open missing.csv",
        ),
        (
            &["self-join", "malformed.csv", "--eps", "1"],
            "line 2: 'abc' is not a number",
        ),
        (
            &["self-join", "ragged.csv", "--eps", "1"],
            "line 2: 3 values, but earlier rows have 2",
        ),
        (&["self-join", "nan.csv", "--eps", "1"], "not finite"),
        (&["self-join", "inf.txt", "--eps", "1"], "not finite"),
        (
            &["self-join", "ok.csv", "--eps", "0"],
            "eps must be a finite number > 0",
        ),
        (
            &["self-join", "ok.csv", "--eps", "-2"],
            "eps must be a finite number > 0",
        ),
        (
            &["self-join", "ok.csv", "--eps", "NaN"],
            "eps must be a finite number > 0",
        ),
        // Beyond what the data's precision can compare exactly (metric::check_eps and
        // check_extent): an error, never a wrong answer.
        (
            &["self-join", "ok.csv", "--eps", "1e200"],
            "eps = 1e200 is out of range for f64 coordinates",
        ),
        (
            &["dbscan", "ok.csv", "--eps", "1e-200", "--min-samples", "2"],
            "eps = 1e-200 is out of range for f64 coordinates",
        ),
        (
            &["knn", "far.csv", "--k", "1"],
            "extent is out of range for f64 distances",
        ),
        (
            &["self-join", "data.xyz", "--eps", "1"],
            "unknown input format",
        ),
        (
            &["self-join", "ok.csv", "--eps", "1", "-o", "out.txt"],
            "unknown output format",
        ),
        (
            &["self-join", "flat.npy", "--eps", "1"],
            "expected a 2-D array",
        ),
        (
            &["self-join", "ints.npy", "--eps", "1"],
            "unsupported dtype",
        ),
        (
            &["join", "ok.csv", "three.csv", "--eps", "1"],
            "A has 2 dimensions but B has 3",
        ),
        (
            &[
                "self-join",
                "ok.csv",
                "--eps",
                "1",
                "--backend",
                "gpu",
                "--device",
                "no such device",
            ],
            "",
        ),
    ];
    for (args, needle) in cases {
        assert_error(&run(&dir, args), needle);
    }
    // Usage errors come from clap (exit 2), still without a panic.
    let out = run(
        &dir,
        &["self-join", "ok.csv", "--eps", "1", "--metric", "hamming"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown Metric 'hamming'"));
}

#[test]
fn demo_saves_its_data_and_self_join_agrees() {
    let dir = scratch("demo");
    let out = stdout_ok(&run(
        &dir,
        &[
            "demo", "--n", "3000", "--dim", "2", "--eps", "0.01", "--save", "pts.npy",
        ],
    ));
    let found: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("Found ")?.split(' ').next()?.parse().ok())
        .expect("demo prints 'Found N pairs'");
    assert!(found > 0, "{out}");
    assert!(out.contains("Neighbour-count histogram"));
    let count = stdout_ok(&run(&dir, &["self-join", "pts.npy", "--eps", "0.01"]));
    assert_eq!(count.trim(), found.to_string());
}

#[test]
fn info_names_the_auto_backend() {
    let out = stdout_ok(&run(&std::env::temp_dir(), &["info"]));
    assert!(out.contains("backend auto chooses: "), "{out}");
    // The copy bandwidth of the default device (lavapipe in CI), as bench/run.py gpu reads it.
    if !out.contains("Vulkan devices: none found") {
        let out = stdout_ok(&run(&std::env::temp_dir(), &["info", "--bandwidth", "4"]));
        let line = out
            .lines()
            .find(|l| l.starts_with("bandwidth on "))
            .unwrap_or_else(|| panic!("no bandwidth line: {out}"));
        assert!(
            line.contains("GB/s, device->host") && line.contains("(4 MiB, best of 3; the link"),
            "{line}"
        );
        assert!(out.contains("serial round trip on "), "{out}");
    }
}

/// Runs every `simjoin ...` line of the ```sh blocks of `page` (a path from the repository
/// root), in order, in one scratch directory; a line's comment `# prints: TEXT` is what its
/// standard output must begin with. Returns the number of commands run.
fn doc_commands_run(page: &str, test: &str) -> usize {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(page);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{page}: {e}"));
    let dir = scratch(test);
    let mut ran = 0;
    for block in text.split("```sh\n").skip(1) {
        let block = block.split("```").next().unwrap();
        for line in block.lines().filter(|l| l.starts_with("simjoin ")) {
            let (command, comment) = line.split_once('#').unwrap_or((line, ""));
            let args: Vec<&str> = command.split_whitespace().skip(1).collect();
            let out = stdout_ok(&run(&dir, &args));
            if let Some(want) = comment.trim().strip_prefix("prints:") {
                let want = want.trim();
                assert!(
                    out.starts_with(want),
                    "{page}: `{}` printed {out:?}; the page shows {want:?}",
                    command.trim()
                );
            }
            ran += 1;
        }
    }
    ran
}

/// Every `simjoin ...` line of the README's examples runs as written, printing what it shows.
#[test]
fn readme_cli_example_runs() {
    let ran = doc_commands_run("README.md", "readme");
    assert!(ran >= 3, "README.md has {ran} commands");
}

/// Every `simjoin ...` line of docs/cli.md runs as written, printing what it shows.
#[test]
fn docs_cli_examples_run() {
    let ran = doc_commands_run("docs/cli.md", "docs-cli");
    assert!(ran >= 9, "docs/cli.md has {ran} commands");
}

/// Reads array `name` of an .npz written by `simjoin knn`: its shape and values.
fn read_npz<T: npyz::Deserialize>(path: &Path, name: &str) -> (Vec<u64>, Vec<T>) {
    let file = std::fs::File::open(path).unwrap();
    let mut zip = zip::ZipArchive::new(file).unwrap();
    let member = zip.by_name(&format!("{name}.npy")).unwrap();
    let npy = npyz::NpyFile::new(member).unwrap();
    let shape = npy.shape().to_vec();
    (shape, npy.into_vec().unwrap())
}

#[test]
fn knn_npz_and_csv_match_the_oracle() {
    let dir = scratch("knn");
    let pts = lcg_points(300, 3, 9);
    write_npy(&dir.join("x.npy"), &pts, &[300, 3], false);
    let q = lcg_points(40, 3, 10);
    write_npy(&dir.join("q.npy"), &q, &[40, 3], false);
    let data = Dataset::from_f64(&pts, 3).unwrap();
    let query = Dataset::from_f64(&q, 3).unwrap();
    for metric in ["euclidean", "manhattan", "chebyshev"] {
        let m: Metric = metric.parse().unwrap();
        // Self-kNN to .npz.
        stdout_ok(&run(
            &dir,
            &[
                "knn", "x.npy", "--k", "7", "--metric", metric, "--output", "knn.npz",
            ],
        ));
        let (want_i, want_d) = oracle::knn(&data, None, 7, m);
        let (shape, idx) = read_npz::<u32>(&dir.join("knn.npz"), "indices");
        assert_eq!(shape, vec![300, 7]);
        assert_eq!(idx, want_i, "{metric}");
        let (shape, dist) = read_npz::<f64>(&dir.join("knn.npz"), "distances");
        assert_eq!(shape, vec![300, 7]);
        assert_eq!(dist, want_d, "{metric}");
        // A-to-B to .csv: query,rank,neighbor,distance.
        stdout_ok(&run(
            &dir,
            &[
                "knn", "x.npy", "--k", "5", "--query", "q.npy", "--metric", metric, "--output",
                "knn.csv",
            ],
        ));
        let (want_i, want_d) = oracle::knn(&data, Some(&query), 5, m);
        let text = std::fs::read_to_string(dir.join("knn.csv")).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("query,rank,neighbor,distance"));
        let rows: Vec<(usize, usize, u32, f64)> = lines
            .map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                (
                    f[0].parse().unwrap(),
                    f[1].parse().unwrap(),
                    f[2].parse().unwrap(),
                    f[3].parse().unwrap(),
                )
            })
            .collect();
        assert_eq!(rows.len(), 40 * 5);
        for (e, &(r, c, j, d)) in rows.iter().enumerate() {
            assert_eq!((r, c), (e / 5, e % 5));
            assert_eq!(j, want_i[e]);
            assert_eq!(d, want_d[e], "distances read back exactly");
        }
    }
    // --stats: one JSON object. Evenly spread 3-D points: auto takes the grid.
    let out = stdout_ok(&run(&dir, &["knn", "x.npy", "--k", "3", "--stats"]));
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["rows"], 300);
    assert_eq!(v["k"], 3);
    assert_eq!(v["algorithm"], "grid");
    for algorithm in ["kdtree", "grid", "brute"] {
        let out = stdout_ok(&run(
            &dir,
            &[
                "knn",
                "x.npy",
                "--k",
                "3",
                "--algorithm",
                algorithm,
                "--stats",
            ],
        ));
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(v["algorithm"], algorithm);
    }
    // Errors: k too large, k = 0, bad output extension, mismatched query dimensions.
    assert_error(&run(&dir, &["knn", "x.npy", "--k", "300"]), "larger than");
    assert_error(&run(&dir, &["knn", "x.npy", "--k", "0"]), "k");
    assert_error(
        &run(&dir, &["knn", "x.npy", "--k", "2", "--output", "k.npy"]),
        ".npz or .csv",
    );
    write_npy(&dir.join("q2.npy"), &q[..80], &[40, 2], false);
    assert_error(
        &run(&dir, &["knn", "x.npy", "--k", "2", "--query", "q2.npy"]),
        "dimensions",
    );
}

/// The pairs (and distances, when there is a column for them) of a .parquet written by
/// `simjoin self-join --output`.
fn read_parquet_pairs(path: &Path) -> (Vec<Pair>, Option<Vec<f64>>) {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float32Type, UInt32Type};
    let file = std::fs::File::open(path).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let (mut pairs, mut dist) = (Vec::new(), Vec::new());
    let mut has_distance = false;
    for batch in reader {
        let batch = batch.unwrap();
        let names: Vec<_> = batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        has_distance = names.len() == 3;
        assert_eq!(names[..2], ["i", "j"]);
        let i = batch.column(0).as_primitive::<UInt32Type>();
        let j = batch.column(1).as_primitive::<UInt32Type>();
        pairs.extend(i.values().iter().zip(j.values()).map(|(&i, &j)| [i, j]));
        if has_distance {
            assert_eq!(names[2], "distance");
            let d = batch.column(2).as_primitive::<Float32Type>();
            dist.extend(d.values().iter().map(|&x| x as f64));
        }
    }
    (pairs, has_distance.then_some(dist))
}

/// The pairs and distances of a .csv written with --distances.
fn read_csv_distances(path: &Path) -> (Vec<Pair>, Vec<f64>) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("i,j,distance"));
    lines
        .map(|l| {
            let v: Vec<&str> = l.split(',').collect();
            (
                [v[0].parse().unwrap(), v[1].parse().unwrap()],
                v[2].parse::<f32>().unwrap() as f64,
            )
        })
        .unzip()
}

fn stats_of(out: &Output) -> serde_json::Value {
    serde_json::from_str(&stdout_ok(out)).unwrap()
}

/// .npy, .csv and .parquet, sorted (in memory, and through the external merge with a
/// budget that forces many runs) and unsorted, all hold exactly the oracle's pairs; sorted
/// ones in the oracle's order.
#[test]
fn streamed_outputs_sorted_and_unsorted_match_the_oracle() {
    let dir = scratch("streamed");
    let pts = lcg_points(4000, 2, 11);
    let pts32: Vec<f32> = pts.iter().map(|&x| x as f32).collect();
    write_npy(&dir.join("x.npy"), &pts32, &[4000, 2], false);
    let eps = "0.05";
    let want = oracle::self_join(
        &Dataset::from_f32(&pts32, 2).unwrap(),
        Metric::Euclidean,
        0.05,
    );
    assert!(want.len() > 50_000, "{}", want.len());
    let read = |name: &str| -> Vec<Pair> {
        let path = dir.join(name);
        match name.rsplit('.').next().unwrap() {
            "npy" => read_npy_pairs(&path),
            "csv" => read_csv_pairs(&path),
            _ => read_parquet_pairs(&path).0,
        }
    };
    for ext in ["npy", "csv", "parquet"] {
        let name = format!("sorted.{ext}");
        let s = stats_of(&run(
            &dir,
            &["self-join", "x.npy", "--eps", eps, "-o", &name, "--stats"],
        ));
        assert_eq!(s["sort_runs"], 0);
        assert_eq!(
            s["output_bytes"],
            std::fs::metadata(dir.join(&name)).unwrap().len()
        );
        assert!(read(&name) == want, "{name}");

        // 64 KiB for the sort: a run per 5461 pairs (12 bytes a pair at the sorter's peak).
        let name = format!("merged.{ext}");
        let args = ["self-join", "x.npy", "--eps", eps, "-o", &name, "--stats"];
        let s = stats_of(&run(&dir, &[&args[..], &["--sort-memory", "64K"]].concat()));
        assert!(
            s["sort_runs"].as_u64().unwrap() >= want.len() as u64 / (65536 / 12),
            "{s}"
        );
        assert!(read(&name) == want, "{name}");

        let name = format!("unsorted.{ext}");
        stdout_ok(&run(
            &dir,
            &[
                "self-join",
                "x.npy",
                "--eps",
                eps,
                "-o",
                &name,
                "--unsorted",
            ],
        ));
        let mut got = read(&name);
        got.sort_unstable();
        assert!(got == want, "{name}");
    }
    // Sort runs go to $TMPDIR when set, and none is left behind.
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let out = Command::new(BIN)
        .args([
            "self-join",
            "x.npy",
            "--eps",
            eps,
            "-o",
            "t.npy",
            "--sort-memory",
            "64K",
        ])
        .current_dir(&dir)
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    stdout_ok(&out);
    assert!(read("t.npy") == want);
    assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 0);
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // An empty result is a valid file of each kind.
    for ext in ["npy", "csv", "parquet"] {
        let name = format!("empty.{ext}");
        stdout_ok(&run(
            &dir,
            &["self-join", "x.npy", "--eps", "1e-9", "-o", &name],
        ));
        assert!(read(&name).is_empty(), "{name}");
    }
}

/// --distances: a third column in .csv and .parquet, each pair's distance (f32 input:
/// f32 distances), in the pairs' order, sorted or not; .npy refuses it.
#[test]
fn distances_in_csv_and_parquet() {
    let dir = scratch("distances");
    let pts = lcg_points(1500, 3, 12);
    let pts32: Vec<f32> = pts.iter().map(|&x| x as f32).collect();
    write_npy(&dir.join("x.npy"), &pts32, &[1500, 3], false);
    let data = Dataset::from_f32(&pts32, 3).unwrap();
    for metric in [Metric::Euclidean, Metric::Chebyshev] {
        let want = oracle::self_join(&data, metric, 0.1);
        assert!(want.len() > 1000);
        let mut o = simjoin::JoinOptions::new(0.1);
        o.metric = metric;
        let exact = simjoin::result::pair_distances(&data, &data, &o, &want).unwrap();
        for sorted in [true, false] {
            for ext in ["csv", "parquet"] {
                let name = format!("d.{ext}");
                let mut args = vec![
                    "self-join",
                    "x.npy",
                    "--eps",
                    "0.1",
                    "--metric",
                    metric.name(),
                ];
                args.extend(["-o", &name, "--distances"]);
                if !sorted {
                    args.push("--unsorted");
                }
                stdout_ok(&run(&dir, &args));
                let (pairs, dist) = match ext {
                    "csv" => read_csv_distances(&dir.join(&name)),
                    _ => {
                        let (p, d) = read_parquet_pairs(&dir.join(&name));
                        (p, d.unwrap())
                    }
                };
                let mut got: Vec<(Pair, f64)> = pairs.into_iter().zip(dist).collect();
                if !sorted {
                    got.sort_unstable_by_key(|e| e.0);
                }
                assert_eq!(got.len(), want.len());
                for (e, (p, d)) in got.iter().enumerate() {
                    assert_eq!(*p, want[e]);
                    // Exactly the library's distance (the CSV text reads back exactly).
                    assert_eq!(*d, exact.get(e), "{name} pair {p:?}");
                    let (x, y) = (
                        &pts32[p[0] as usize * 3..][..3],
                        &pts32[p[1] as usize * 3..][..3],
                    );
                    let diffs = x.iter().zip(y).map(|(a, b)| (*a as f64 - *b as f64).abs());
                    let d64 = match metric {
                        Metric::Euclidean => diffs.map(|t| t * t).sum::<f64>().sqrt(),
                        _ => diffs.fold(0.0, f64::max),
                    };
                    assert!((d - d64).abs() <= 1e-6, "{d} vs {d64}");
                }
            }
        }
    }
    assert_error(
        &run(
            &dir,
            &[
                "self-join",
                "x.npy",
                "--eps",
                "0.1",
                "-o",
                "d.npy",
                "--distances",
            ],
        ),
        "--distances needs a .csv or .parquet output",
    );
}

/// SIGINT during a long join (32-D, no pair within eps, nearly every pair compared), a
/// kNN and a DBSCAN: the command exits within 250 ms with status 130 and a one-line
/// message, leaves no output file, and the same command run to the end on a smaller
/// input still gives the oracle's answer.
#[test]
fn sigint_stops_the_command_cleanly() {
    let dir = scratch("sigint");
    let (n, d) = (200_000, 32);
    let x: Vec<f32> = lcg_points(n, d, 11).iter().map(|&v| v as f32).collect();
    write_npy(&dir.join("far.npy"), &x, &[n as u64, d as u64], false);
    for args in [
        &[
            "self-join",
            "far.npy",
            "--eps",
            "0.5",
            "--backend",
            "cpu",
            "-o",
            "pairs.npy",
        ][..],
        &[
            "self-join",
            "far.npy",
            "--eps",
            "0.5",
            "--backend",
            "cpu",
            "--algorithm",
            "brute",
        ],
        &[
            "knn",
            "far.npy",
            "--k",
            "10",
            "--backend",
            "cpu",
            "--algorithm",
            "brute",
        ],
        &[
            "dbscan",
            "far.npy",
            "--eps",
            "0.5",
            "--min-samples",
            "5",
            "--backend",
            "cpu",
        ],
        // The GPU path (lavapipe under tests/run.sh, validation on).
        &[
            "self-join",
            "far.npy",
            "--eps",
            "0.5",
            "--backend",
            "gpu",
            "-o",
            "pairs.npy",
        ],
    ] {
        let gpu = args.contains(&"gpu");
        if gpu && std::env::var_os("VK_DRIVER_FILES").is_none() {
            continue; // no pinned Vulkan driver (tests/run.sh pins lavapipe)
        }
        let mut child = Command::new(BIN)
            .args(args)
            .current_dir(&dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Past reading the input: the join itself is running (on the GPU, past compiling its
        // kernel, which lavapipe with validation takes a few hundred ms to do and a stop
        // waits for).
        std::thread::sleep(std::time::Duration::from_millis(if gpu {
            2000
        } else {
            700
        }));
        assert!(
            child.try_wait().unwrap().is_none(),
            "{args:?} ended too soon"
        );
        let asked = std::time::Instant::now();
        // SAFETY: kill() on our own child's pid.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
        let out = child.wait_with_output().unwrap();
        let took = asked.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(130), "{args:?}: {stderr}");
        assert!(stderr.contains("interrupted after"), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        // The GPU job on lavapipe: the kernels see the stop word between their work items,
        // and a software GPU's items, time-sliced on two cores with this binary's other
        // tests' commands (validation on), took up to 357 ms to wind down, once 1.015 s
        // (CI, 2026-12-06; 40-110 ms unloaded). The CPU's stop is checked between tasks.
        let limit = if gpu { 2000 } else { 250 };
        assert!(
            took < std::time::Duration::from_millis(limit),
            "{args:?}: exited {took:?} after SIGINT: {stderr}"
        );
        assert!(
            !dir.join("pairs.npy").exists(),
            "an incomplete output was left"
        );
    }
    // The same command to the end, on a part small enough to finish.
    let small = &x[..2000 * d];
    write_npy(&dir.join("small.npy"), small, &[2000, d as u64], false);
    stdout_ok(&run(
        &dir,
        &["self-join", "small.npy", "--eps", "1.0", "-o", "pairs.npy"],
    ));
    let data = Dataset::from_f32(small, d).unwrap();
    let want = oracle::self_join(&data, Metric::Euclidean, 1.0);
    assert!(!want.is_empty());
    assert_eq!(read_npy_pairs(&dir.join("pairs.npy")), want);
}

/// With --output and no --stats, one line says what was done; exit codes are as docs/cli.md
/// says (2 for a usage error, from clap).
#[test]
fn output_runs_say_what_they_did() {
    let dir = scratch("says");
    let x = lcg_points(500, 2, 3);
    write_npy(&dir.join("p.npy"), &x, &[500, 2], false);
    let out = stdout_ok(&run(
        &dir,
        &[
            "self-join",
            "p.npy",
            "--eps",
            "0.05",
            "--backend",
            "cpu",
            "-o",
            "pairs.csv",
        ],
    ));
    let data = Dataset::from_f64(&x, 2).unwrap();
    let n = oracle::self_join(&data, Metric::Euclidean, 0.05).len();
    assert!(n > 0);
    assert!(
        out.starts_with(&format!("wrote {n} pairs to pairs.csv (")) && out.contains(" on cpu ("),
        "{out}"
    );
    assert_eq!(out.lines().count(), 1, "{out}");
    let out = run(
        &dir,
        &["self-join", "p.npy", "--eps", "0.05", "--metric", "hamming"],
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("chebyshev, cosine, haversine)"), "{err}");
}

/// `--columns` picks the coordinates of a CSV (by header name, quoted fields with commas
/// around them, or by index) and of a Parquet file: a haversine self-join of named places
/// equals the oracle on their latitudes and longitudes; a missing name or index is a clear
/// error naming the columns.
#[test]
fn columns_pick_latitude_and_longitude() {
    use arrow_array::{Float32Array, Float64Array, Int64Array, RecordBatch, StringArray};
    use std::sync::Arc;
    let dir = scratch("columns");
    // Places around Paris, a few km apart: (lat, lon) in degrees.
    let raw = lcg_points(300, 2, 41);
    let coords: Vec<f64> = raw
        .chunks(2)
        .flat_map(|p| [48.80 + 0.1 * p[0], 2.25 + 0.15 * p[1]])
        .collect();
    let mut csv = String::from("id,name,lat,lon,note\n");
    for (i, p) in coords.chunks(2).enumerate() {
        csv += &format!(
            "{i},\"Place {i}, Paris\",{:?},{:?},\"said \"\"hi\"\"\"\n",
            p[0], p[1]
        );
    }
    std::fs::write(dir.join("places.csv"), csv).unwrap();
    let data = Dataset::from_f64(&coords, 2).unwrap();
    let want = oracle::self_join(&data, Metric::Haversine, 1500.0);
    assert!(want.len() > 100, "{}", want.len());
    // Parquet: an id, the coordinates (latitude f64, longitude f32 as stored), a name.
    let lon32: Vec<f32> = coords.chunks(2).map(|p| p[1] as f32).collect();
    let batch = RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from_iter_values(0..300)) as _),
        (
            "name",
            Arc::new(StringArray::from_iter_values(
                (0..300).map(|i| format!("p{i}")),
            )) as _,
        ),
        (
            "lat",
            Arc::new(Float64Array::from_iter_values(
                coords.chunks(2).map(|p| p[0]),
            )) as _,
        ),
        ("lon", Arc::new(Float32Array::from(lon32.clone())) as _),
    ])
    .unwrap();
    let file = std::fs::File::create(dir.join("places.parquet")).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let coords_pq: Vec<f64> = coords
        .chunks(2)
        .zip(&lon32)
        .flat_map(|(p, &lon)| [p[0], lon as f64])
        .collect();
    let want_pq = oracle::self_join(
        &Dataset::from_f64(&coords_pq, 2).unwrap(),
        Metric::Haversine,
        1500.0,
    );
    for (file, columns, want) in [
        ("places.csv", "lat,lon", &want),
        ("places.csv", "2,3", &want),
        ("places.parquet", "lat,lon", &want_pq),
        ("places.parquet", "2,3", &want_pq),
    ] {
        let out = stdout_ok(&run(
            &dir,
            &[
                "self-join",
                file,
                "--metric",
                "haversine",
                "--eps",
                "1500",
                "--columns",
                columns,
                "--backend",
                "cpu",
                "-o",
                "pairs.npy",
            ],
        ));
        assert!(!out.is_empty());
        assert_eq!(
            &read_npy_pairs(&dir.join("pairs.npy")),
            want,
            "{file} --columns {columns}"
        );
    }
    // Swapped columns are other points (longitude read as latitude): not the same pairs.
    stdout_ok(&run(
        &dir,
        &[
            "self-join",
            "places.csv",
            "--metric",
            "haversine",
            "--eps",
            "1500",
            "--columns",
            "lon,lat",
            "-o",
            "swapped.npy",
        ],
    ));
    assert_ne!(read_npy_pairs(&dir.join("swapped.npy")), want);
    for (file, columns, needle) in [
        (
            "places.csv",
            "lat,longitude",
            "no column named 'longitude' (the columns: id, name, lat, lon, note)",
        ),
        ("places.csv", "2,9", "column 9 does not exist"),
        ("places.csv", "name,lat", "is not a number"),
        ("places.parquet", "lat,height", "no column named 'height'"),
        (
            "places.parquet",
            "name,lat",
            "coordinates must be a float or integer type",
        ),
    ] {
        assert_error(
            &run(
                &dir,
                &[
                    "self-join",
                    file,
                    "--metric",
                    "haversine",
                    "--eps",
                    "1500",
                    "--columns",
                    columns,
                ],
            ),
            needle,
        );
    }
}

/// `--sphere-radius` sets haversine's sphere: on the unit sphere eps is in radians, the
/// pairs are the rule's on that sphere, and a radius on another metric is refused.
#[test]
fn sphere_radius_sets_the_sphere() {
    use simjoin::metric::{geo_chord2, geo_chord_threshold, geo_row};
    let dir = scratch("sphere-radius");
    // Places around Paris, a few km apart: (lat, lon) in degrees.
    let coords: Vec<f64> = lcg_points(400, 2, 43)
        .chunks(2)
        .flat_map(|p| [48.80 + 0.1 * p[0], 2.25 + 0.15 * p[1]])
        .collect();
    let text: String = coords
        .chunks(2)
        .map(|p| format!("{:?},{:?}\n", p[0], p[1]))
        .collect();
    std::fs::write(dir.join("places.csv"), text).unwrap();
    // 1.5 km on the Earth is 2.35e-4 rad.
    let eps = 2.35e-4;
    let thr = geo_chord_threshold(eps, 1.0);
    let v: Vec<[f64; 3]> = coords.chunks(2).map(geo_row).collect();
    let want: Vec<[u32; 2]> = (0..v.len())
        .flat_map(|i| (i + 1..v.len()).map(move |j| [i as u32, j as u32]))
        .filter(|&[i, j]| geo_chord2(&v[i as usize], &v[j as usize]) <= thr)
        .collect();
    assert!(want.len() > 100, "{}", want.len());
    let eps_arg = format!("{eps:e}");
    let args = |extra: &[&'static str]| {
        let mut a = vec![
            "self-join",
            "places.csv",
            "--metric",
            "haversine",
            "--eps",
            &eps_arg,
            "--sphere-radius",
            "1",
            "--backend",
            "cpu",
        ];
        a.extend_from_slice(extra);
        a.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let run_args = |a: Vec<String>| run(&dir, &a.iter().map(|s| s.as_str()).collect::<Vec<_>>());
    stdout_ok(&run_args(args(&["-o", "pairs.npy"])));
    assert_eq!(read_npy_pairs(&dir.join("pairs.npy")), want);
    // The Earth's sphere at the same eps: hardly a pair (eps would be 0.2 mm).
    stdout_ok(&run(
        &dir,
        &[
            "self-join",
            "places.csv",
            "--metric",
            "haversine",
            "--eps",
            &eps_arg,
            "-o",
            "earth.npy",
        ],
    ));
    assert!(read_npy_pairs(&dir.join("earth.npy")).len() < want.len() / 10);
    // Distances in radians, at most eps.
    stdout_ok(&run_args(args(&["--distances", "-o", "d.csv"])));
    let text = std::fs::read_to_string(dir.join("d.csv")).unwrap();
    let d: Vec<f64> = text
        .lines()
        .skip(1)
        .map(|l| l.rsplit(',').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(d.len(), want.len());
    assert!(d.iter().all(|&x| x <= eps) && d.iter().any(|&x| x > eps / 2.0));
    assert_error(
        &run(
            &dir,
            &[
                "self-join",
                "places.csv",
                "--eps",
                "0.1",
                "--sphere-radius",
                "2",
            ],
        ),
        "haversine only",
    );
    assert_error(
        &run(
            &dir,
            &[
                "self-join",
                "places.csv",
                "--metric",
                "haversine",
                "--eps",
                "1",
                "--sphere-radius=-3",
            ],
        ),
        "sphere_radius",
    );
}
