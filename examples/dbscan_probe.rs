use simjoin::*;
use std::time::Instant;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = &args[1];
    let eps: f64 = args[2].parse().unwrap();
    let bytes = std::fs::read(path).unwrap();
    let npy = npyz::NpyFile::new(&bytes[..]).unwrap();
    let dim = npy.shape()[1] as usize;
    let x: Vec<f64> = npy.into_vec().unwrap();
    let data = Dataset::from_f64(&x, dim).unwrap();
    let e = Engine::new();
    let mut o = JoinOptions::new(eps);
    o.backend = Backend::Cpu;
    for _ in 0..2 {
        let t = Instant::now();
        let mut c = 0u64;
        let mut sink = |ch: &[Pair]| -> anyhow::Result<()> {
            c += ch.len() as u64;
            Ok(())
        };
        let r = e.self_join_stream(&data, &o, &mut sink).unwrap();
        println!(
            "noop sink: {:.3}s pairs {} {:?}",
            t.elapsed().as_secs_f64(),
            c,
            r.phases
        );
        let mut oc = o.clone();
        oc.output = OutputForm::Count;
        let t = Instant::now();
        let r = e.self_join(&data, &oc).unwrap();
        println!(
            "count: {:.3}s {:?}",
            t.elapsed().as_secs_f64(),
            r.report.phases
        );
        let t = Instant::now();
        let mut d = DbscanOptions::new(eps, 10);
        d.backend = Backend::Cpu;
        let r = dbscan(&e, &data, &d).unwrap();
        println!(
            "dbscan: {:.3}s {:?}",
            t.elapsed().as_secs_f64(),
            r.report.phases
        );
    }
}
