//! A result larger than the memory it is written in: `simjoin self-join --unsorted` writes
//! over 4 GB of pairs to .npy with a peak resident set under 1 GiB, and the file read back
//! holds exactly the pairs of the same join run in memory-free counting form.

use simjoin::{Dataset, Engine, JoinOptions, Pair};
use std::io::BufReader;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_simjoin");

/// An order-independent digest of a set of pairs: the wrapping sum of a mix of each pair.
fn digest(pairs: impl IntoIterator<Item = Pair>) -> (u64, u64) {
    let mut count = 0u64;
    let mut sum = 0u64;
    for [i, j] in pairs {
        // splitmix64's finaliser: every bit of the pair moves every bit of the term.
        let mut z = ((i as u64) << 32 | j as u64).wrapping_add(0x9e3779b97f4a7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        sum = sum.wrapping_add(z ^ (z >> 31));
        count += 1;
    }
    (count, sum)
}

/// Runs `simjoin args` to completion; its exit status, stdout and peak RSS in bytes.
#[expect(
    clippy::zombie_processes,
    reason = "reaped by wait4, which also gives its resource usage"
)]
fn run_measured(dir: &std::path::Path, args: &[&str]) -> (bool, String, u64) {
    let child = Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.unwrap(), &mut stdout).unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of that plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child (not yet reaped: `Child` is not waited on), writing
    // into the two locals above.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    // Linux reports ru_maxrss in KiB.
    (ok, stdout, usage.ru_maxrss as u64 * 1024)
}

#[test]
fn four_gigabytes_of_unsorted_pairs_in_under_a_gibibyte() {
    let dir = std::env::temp_dir().join(format!("simjoin-large-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // 300k uniform points in the unit square; eps 0.065 gives ~565M pairs (4.5 GB).
    let n = 300_000usize;
    let mut s = 7u64;
    let pts: Vec<f32> = (0..2 * n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 40) as f32 / (1u64 << 24) as f32
        })
        .collect();
    {
        use npyz::WriterBuilder;
        let mut w = npyz::WriteOptions::<f32>::new()
            .default_dtype()
            .shape(&[n as u64, 2])
            .writer(std::fs::File::create(dir.join("x.npy")).unwrap())
            .begin_nd()
            .unwrap();
        w.extend(pts.iter().copied()).unwrap();
        w.finish().unwrap();
    }
    let eps = "0.065";
    let (ok, stats, peak) = run_measured(
        &dir,
        &[
            "self-join",
            "x.npy",
            "--eps",
            eps,
            "--backend",
            "cpu",
            "--unsorted",
            "-o",
            "big.npy",
            "--stats",
        ],
    );
    let path = dir.join("big.npy");
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    // Read the file back, streaming: the header's shape, every pair in range, the digest.
    let read_back = ok.then(|| {
        let npy = npyz::NpyFile::new(BufReader::with_capacity(
            1 << 22,
            std::fs::File::open(&path).unwrap(),
        ))
        .unwrap();
        let shape = npy.shape().to_vec();
        let mut values = npy.data::<u32>().unwrap().map(Result::unwrap);
        let pairs = std::iter::from_fn(|| Some([values.next()?, values.next().unwrap()]));
        let d = digest(pairs.inspect(|&[i, j]| assert!(i < j && (j as usize) < n)));
        (shape, d)
    });
    let count = Command::new(BIN)
        .args(["self-join", "x.npy", "--eps", eps, "--backend", "cpu"])
        .current_dir(&dir)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(ok, "simjoin failed");
    let (shape, got) = read_back.unwrap();
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    eprintln!(
        "{size} bytes, {} pairs, peak RSS {:.1} MiB, join {:.1} s, write {:.1} s",
        stats["pairs"],
        peak as f64 / (1 << 20) as f64,
        stats["seconds"].as_f64().unwrap(),
        stats["write_seconds"].as_f64().unwrap()
    );
    assert!(size >= 4_000_000_000, "only {size} bytes");
    assert_eq!(stats["output_bytes"], size);
    assert!(peak < 1 << 30, "peak RSS {peak} bytes");
    assert_eq!(shape, [got.0, 2]);

    // The count-only join, and the same join's pairs digested as they stream (never
    // stored), agree with the file.
    assert!(count.status.success());
    assert_eq!(
        String::from_utf8_lossy(&count.stdout).trim(),
        got.0.to_string()
    );
    let data = Dataset::from_f32(&pts, 2).unwrap();
    let mut opts = JoinOptions::new(0.065);
    opts.backend = simjoin::Backend::Cpu;
    let mut want = (0u64, 0u64);
    let mut sink = |chunk: &[Pair]| -> anyhow::Result<()> {
        let (c, d) = digest(chunk.iter().copied());
        want = (want.0 + c, want.1.wrapping_add(d));
        Ok(())
    };
    Engine::new()
        .self_join_stream(&data, &opts, &mut sink)
        .unwrap();
    assert_eq!(got, want, "(count, digest) read back vs the join's own");
}
