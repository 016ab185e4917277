fn main() {
    println!("simjoin {}", env!("CARGO_PKG_VERSION"));
}
