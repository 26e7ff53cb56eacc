//! A UDP relay that makes a link slow and lossy: each datagram is held for
//! a delay (plus jitter) and dropped with a seeded probability, both ways.
//! The kernel here has no netem qdisc, so delay, jitter and loss are done
//! in user space; rate is `tc tbf` on the veth (`netns::Net::shape`).
//!
//! It stands in front of a QUIC listener: clients send to the relay's
//! address, the relay forwards from a socket of its own per client to the
//! upstream address, and answers come back the same way. Datagrams of one
//! direction leave in the order they came (jitter varies the delay, it does
//! not reorder: a path on the internet seldom does).

use std::collections::{BinaryHeap, HashMap};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use iota_core::rng::Rng;

/// What the relay does to every datagram, each way.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkShape {
    /// One-way delay: a round trip through the relay takes twice this.
    pub delay: Duration,
    /// Extra delay drawn uniformly from [0, jitter) per datagram.
    pub jitter: Duration,
    /// Probability that a datagram is dropped (each way).
    pub loss: f64,
    pub seed: u64,
}

/// Clients one relay serves at most: a relay in front of one miner sees
/// one per peer, and an unbounded map is what the house rules forbid.
const MAX_CLIENTS: usize = 256;
/// Datagrams held at once; past this they are dropped, as a full queue would.
const MAX_HELD: usize = 65_536;

#[derive(Default)]
pub struct RelayStats {
    pub forwarded: AtomicU64,
    pub dropped: AtomicU64,
}

/// Where a held datagram goes: upstream from a client's socket, or back to
/// a client from the listening socket.
enum Leg {
    Up(Arc<UdpSocket>),
    Down(Arc<UdpSocket>, SocketAddr),
}

struct Held {
    due: Instant,
    order: u64,
    leg: Leg,
    bytes: Vec<u8>,
}

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        (self.due, self.order) == (o.due, o.order)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    // Earliest first out of a max-heap.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.due, o.order).cmp(&(self.due, self.order))
    }
}

struct Queue {
    heap: BinaryHeap<Held>,
    rng: Rng,
    order: u64,
    /// The last departure time of each direction (up, down): no datagram
    /// leaves before one that came earlier.
    last_due: [Instant; 2],
}

struct Shared {
    shape: LinkShape,
    queue: Mutex<Queue>,
    ready: Condvar,
    stop: AtomicBool,
    stats: RelayStats,
}

impl Shared {
    fn hold(&self, leg: Leg, bytes: Vec<u8>) {
        let mut q = self.queue.lock().unwrap();
        if q.rng.next_f64() < self.shape.loss || q.heap.len() >= MAX_HELD {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let jitter = self.shape.jitter.mul_f64(q.rng.next_f64());
        let dir = matches!(leg, Leg::Down(..)) as usize;
        let due = (Instant::now() + self.shape.delay + jitter).max(q.last_due[dir]);
        q.last_due[dir] = due;
        q.order += 1;
        let order = q.order;
        q.heap.push(Held { due, order, leg, bytes });
        self.ready.notify_one();
    }
}

/// A running relay; stopped (its threads joined) when dropped.
pub struct UdpRelay {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    pub listen: SocketAddr,
}

impl UdpRelay {
    /// Listens on `listen` in network namespace `ns` (None: this process's)
    /// and relays to `upstream`, shaped by `shape`.
    pub fn start(
        ns: Option<&str>,
        listen: SocketAddr,
        upstream: SocketAddr,
        shape: LinkShape,
    ) -> std::io::Result<UdpRelay> {
        let now = Instant::now();
        let shared = Arc::new(Shared {
            shape,
            queue: Mutex::new(Queue {
                heap: BinaryHeap::new(),
                rng: Rng::new(shape.seed),
                order: 0,
                last_due: [now, now],
            }),
            ready: Condvar::new(),
            stop: AtomicBool::new(false),
            stats: RelayStats::default(),
        });
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let ns = ns.map(str::to_string);
        let listener = {
            let shared = shared.clone();
            std::thread::spawn(move || {
                // Sockets belong to the namespace of the thread that makes
                // them: this thread makes the listening one and every
                // client's, so it moves into the namespace first.
                let sock = ns.as_deref().map_or(Ok(()), enter_namespace).and_then(|()| UdpSocket::bind(listen));
                let sock = match sock {
                    Ok(s) => Arc::new(s),
                    Err(e) => {
                        let _ = bound_tx.send(Err(e));
                        return;
                    }
                };
                let _ = bound_tx.send(sock.local_addr());
                accept_loop(&shared, &sock, upstream);
            })
        };
        let bound = bound_rx.recv().map_err(|_| std::io::Error::other("the relay thread ended"))?;
        let listen = match bound {
            Ok(a) => a,
            Err(e) => {
                let _ = listener.join();
                return Err(e);
            }
        };
        let sender = {
            let shared = shared.clone();
            std::thread::spawn(move || send_loop(&shared))
        };
        Ok(UdpRelay { shared, threads: vec![listener, sender], listen })
    }

    pub fn stats(&self) -> &RelayStats {
        &self.shared.stats
    }
}

impl Drop for UdpRelay {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.ready.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Moves the calling thread into the named network namespace
/// (`ip netns add NAME` made /run/netns/NAME).
pub fn enter_namespace(ns: &str) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(format!("/run/netns/{ns}"))?;
    // SAFETY: setns on a valid descriptor of a network namespace; it
    // changes only this thread's namespace.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

const POLL: Duration = Duration::from_millis(50);

fn accept_loop(shared: &Arc<Shared>, sock: &Arc<UdpSocket>, upstream: SocketAddr) {
    let _ = sock.set_read_timeout(Some(POLL));
    let mut clients: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
    let mut readers = Vec::new();
    let mut buf = vec![0u8; 65_536];
    while !shared.stop.load(Ordering::Relaxed) {
        let Ok((n, from)) = sock.recv_from(&mut buf) else { continue };
        let up = match clients.get(&from) {
            Some(s) => s.clone(),
            None if clients.len() >= MAX_CLIENTS => {
                shared.stats.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            None => {
                let Ok(s) = UdpSocket::bind(("0.0.0.0", 0)).and_then(|s| s.connect(upstream).map(|()| s)) else {
                    continue;
                };
                let _ = s.set_read_timeout(Some(POLL));
                let s = Arc::new(s);
                clients.insert(from, s.clone());
                let (shared, s2, listener, back) = (shared.clone(), s.clone(), sock.clone(), from);
                readers.push(std::thread::spawn(move || {
                    let mut buf = vec![0u8; 65_536];
                    while !shared.stop.load(Ordering::Relaxed) {
                        if let Ok(n) = s2.recv(&mut buf) {
                            shared.hold(Leg::Down(listener.clone(), back), buf[..n].to_vec());
                        }
                    }
                }));
                s
            }
        };
        shared.hold(Leg::Up(up), buf[..n].to_vec());
    }
    for r in readers {
        let _ = r.join();
    }
}

fn send_loop(shared: &Shared) {
    let mut q = shared.queue.lock().unwrap();
    while !shared.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        match q.heap.peek().map(|h| h.due) {
            Some(due) if due <= now => {
                let h = q.heap.pop().expect("peeked");
                // Sent without the lock: a full socket buffer must not
                // hold up the readers.
                drop(q);
                let sent = match &h.leg {
                    Leg::Up(s) => s.send(&h.bytes),
                    Leg::Down(s, to) => s.send_to(&h.bytes, to),
                };
                let counter = if sent.is_ok() { &shared.stats.forwarded } else { &shared.stats.dropped };
                counter.fetch_add(1, Ordering::Relaxed);
                q = shared.queue.lock().unwrap();
            }
            Some(due) => q = shared.ready.wait_timeout(q, due - now).unwrap().0,
            None => q = shared.ready.wait_timeout(q, POLL).unwrap().0,
        }
    }
}
