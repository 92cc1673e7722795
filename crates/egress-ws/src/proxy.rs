//! A TCP proxy that kills connections at random moments: for chaos tests
//! and the demo. It cuts both directions at once, wherever the bytes are:
//! mid-frame, during the handshake, between a data frame and its ack.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::{AbortHandle, JoinHandle};

/// When the proxy kills its connections: at intervals drawn uniformly from
/// `[0, 2 * mean_interval]`, from a seeded generator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chaos {
    /// The seed.
    pub seed: u64,
    /// The mean time between kills.
    pub mean_interval: Duration,
}

/// A forwarding proxy from a local port to `target`. See the module docs.
#[derive(Debug)]
pub struct ChaosProxy {
    local_addr: SocketAddr,
    links: Arc<Mutex<Vec<AbortHandle>>>,
    kills: Arc<AtomicU64>,
    accepted: Arc<Notify>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for ChaosProxy {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        self.kill_all();
    }
}

impl ChaosProxy {
    /// Starts a proxy on 127.0.0.1 (any free port) forwarding to `target`,
    /// killing connections on `chaos`'s schedule if given.
    ///
    /// # Errors
    /// The bind's I/O error.
    pub async fn start(target: SocketAddr, chaos: Option<Chaos>) -> std::io::Result<ChaosProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let local_addr = listener.local_addr()?;
        let links: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let kills = Arc::new(AtomicU64::new(0));
        let accepted = Arc::new(Notify::new());
        let mut tasks = vec![tokio::spawn(forward(listener, target, links.clone(), accepted.clone()))];
        if let Some(chaos) = chaos {
            let (links, kills) = (links.clone(), kills.clone());
            tasks.push(tokio::spawn(async move {
                let mut rng = crate::rng::Xorshift::new(chaos.seed);
                let span = u64::try_from(chaos.mean_interval.as_micros()).unwrap_or(u64::MAX).saturating_mul(2);
                loop {
                    tokio::time::sleep(Duration::from_micros(rng.next_u64() % span.max(1))).await;
                    if cut(&links) > 0 {
                        kills.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        Ok(ChaosProxy { local_addr, links, kills, accepted, tasks })
    }

    /// The address to connect to instead of the target.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Kills every connection now.
    pub fn kill_all(&self) {
        if cut(&self.links) > 0 {
            self.kills.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Kills the connections open now, or, if none is, the next one to
    /// open: a schedule of these (as the demo's, at seeded points of its
    /// run) kills exactly as often as it asks.
    pub async fn kill_next(&self) {
        loop {
            let accepted = self.accepted.notified();
            tokio::pin!(accepted);
            accepted.as_mut().enable();
            if cut(&self.links) > 0 {
                self.kills.fetch_add(1, Ordering::Relaxed);
                return;
            }
            accepted.await;
        }
    }

    /// How many times it has killed connections.
    pub fn kills(&self) -> u64 {
        self.kills.load(Ordering::Relaxed)
    }
}

/// Aborts every forwarding task; returns how many there were.
fn cut(links: &Mutex<Vec<AbortHandle>>) -> usize {
    let Ok(mut links) = links.lock() else { return 0 };
    let live = links.iter().filter(|l| !l.is_finished()).count();
    for l in links.drain(..) {
        l.abort();
    }
    live
}

async fn forward(
    listener: TcpListener,
    target: SocketAddr,
    links: Arc<Mutex<Vec<AbortHandle>>>,
    accepted: Arc<Notify>,
) {
    while let Ok((client, _)) = listener.accept().await {
        let link = tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(target).await else { return };
            let _ = (client.set_nodelay(true), server.set_nodelay(true));
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            let up = tokio::io::copy(&mut cr, &mut sw);
            let down = tokio::io::copy(&mut sr, &mut cw);
            // Either direction ending ends both: a connection dies whole.
            tokio::select! {
                _ = up => {}
                _ = down => {}
            }
        });
        if let Ok(mut links) = links.lock() {
            // Bounded by the connections open: the ended ones go.
            links.retain(|l| !l.is_finished());
            links.push(link.abort_handle());
        }
        accepted.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn the_proxy_holds_only_its_open_links() {
        // A target that accepts and closes at once: every link ends.
        let target = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let to = target.local_addr().expect("an address");
        tokio::spawn(async move {
            while let Ok((stream, _)) = target.accept().await {
                drop(stream);
            }
        });
        let proxy = ChaosProxy::start(to, None).await.expect("starts");
        for _ in 0..20 {
            let accepted = proxy.accepted.notified();
            tokio::pin!(accepted);
            accepted.as_mut().enable();
            let _client = TcpStream::connect(proxy.local_addr()).await.expect("connects");
            accepted.await; // its link is in the list...
            // ...and has ended (its target closed it).
            while proxy.links.lock().expect("links").iter().any(|l| !l.is_finished()) {
                tokio::task::yield_now().await;
            }
        }
        let held = proxy.links.lock().expect("links").len();
        assert_eq!(held, 1, "only the last link is held of 20 ended connections");
    }
}
