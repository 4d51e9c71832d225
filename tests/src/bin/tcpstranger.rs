//! A stranger on a TCP port, for the tests of issue 55 item 3: it opens connections to a rank's
//! TCP fabric listener or to `tmpirun`'s bootstrap service and never proves anything.
//!
//! `tcpstranger ADDR COUNT TRICKLE_MS HOLD_SECS`: opens `COUNT` connections to `ADDR`, prints
//! `OPEN <n>` (how many connected), then for at most `HOLD_SECS` seconds sends one byte on
//! each open connection every `TRICKLE_MS` milliseconds (never, when 0), reads and drops
//! whatever comes back, and prints `CLOSED <i> <ms>` when the other side closes connection
//! `i` (`ms` after it was opened). It ends when every connection is closed or the time is up,
//! printing `END <closed> of <n>`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        return Err("usage: tcpstranger ADDR COUNT TRICKLE_MS HOLD_SECS".into());
    }
    let addr: SocketAddr = args[1].parse()?;
    let (count, trickle_ms, hold): (usize, u64, u64) = (args[2].parse()?, args[3].parse()?, args[4].parse()?);
    let mut conns: Vec<(TcpStream, Instant, bool)> = Vec::with_capacity(count);
    for _ in 0..count {
        // A refused or unanswered connect (a full backlog) is not counted as open.
        if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            s.set_nonblocking(true)?;
            conns.push((s, Instant::now(), false));
        }
    }
    println!("OPEN {}", conns.len());
    let start = Instant::now();
    let trickle = (trickle_ms > 0).then(|| Duration::from_millis(trickle_ms));
    let mut next_byte = trickle.map(|t| start + t);
    let mut buf = [0u8; 4096];
    let mut closed = 0;
    while closed < conns.len() && start.elapsed() < Duration::from_secs(hold) {
        let send = next_byte.is_some_and(|t| Instant::now() >= t);
        if send {
            next_byte = trickle.map(|t| Instant::now() + t);
        }
        for (i, (s, opened, gone)) in conns.iter_mut().enumerate() {
            if *gone {
                continue;
            }
            let mut ended = match s.read(&mut buf) {
                Ok(0) => true,
                Ok(_) => false,
                Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
            };
            if send && !ended {
                ended = s.write(b"x").is_err();
            }
            if ended {
                *gone = true;
                closed += 1;
                println!("CLOSED {i} {}", opened.elapsed().as_millis());
            }
        }
        std::io::stdout().flush()?;
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("END {closed} of {}", conns.len());
    Ok(())
}
