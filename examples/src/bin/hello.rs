//! Every rank says hello: the smallest tmpi program.
//!
//! `tmpirun -n 4 hello` prints `Hello from rank R of 4` once per rank, in any order.

fn main() -> tmpi::Result<()> {
    let world = tmpi::init()?;
    println!("Hello from rank {} of {}", world.rank(), world.size());
    world.finalize()
}
