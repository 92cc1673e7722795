//! `egress-chat`: a terminal chat client (the default) and its server
//! (`egress-chat serve`). Two clients in two terminals talk through one
//! server:
//!
//! ```text
//! cargo run --release -p egress-chat -- serve
//! cargo run --release -p egress-chat -- --name alice --room general --room random
//! cargo run --release -p egress-chat -- --name bob --room general
//! ```
//!
//! Logs go to a file (`--log`), never to the screen.

use std::io::Stdout;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use crossterm::event::{Event, EventStream, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use egress_chat::client::{Client, ClientConfig};
use egress_chat::server::{Server, ServerConfig};
use egress_chat::ui::{Input, render, view};
use egress_reactive::AsyncContext;
use futures_util::StreamExt as _;
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;

#[derive(Parser, Debug)]
#[command(name = "egress-chat", about = "A terminal chat on egress cells, and its server.")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Your name.
    #[arg(long, default_value = "me")]
    name: String,
    /// A room to join (repeat for several).
    #[arg(long = "room", default_value = "general")]
    rooms: Vec<String>,
    /// The server's egress endpoint.
    #[arg(long, default_value = "127.0.0.1:7878")]
    server: SocketAddr,
    /// The server's push channel.
    #[arg(long, default_value = "127.0.0.1:7879")]
    push: SocketAddr,
    /// The client's database (default: egress-chat-NAME.db).
    #[arg(long)]
    db: Option<PathBuf>,
    /// Trust this certificate (PEM) and connect with wss:// to localhost.
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// Write logs to this file.
    #[arg(long)]
    log: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Runs the server.
    Serve {
        /// The egress endpoint.
        #[arg(long, default_value = "127.0.0.1:7878")]
        listen: SocketAddr,
        /// The push channel.
        #[arg(long, default_value = "127.0.0.1:7879")]
        push: SocketAddr,
        /// The server's database.
        #[arg(long, default_value = "egress-chat-server.db")]
        db: PathBuf,
        /// A certificate (PEM) for wss://, with --tls-key.
        #[arg(long, requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// The certificate's key (PEM).
        #[arg(long, requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// Write logs to this file (default: standard error).
        #[arg(long)]
        log: Option<PathBuf>,
    },
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Serve { listen, push, db, tls_cert, tls_key, log }) => {
            logging(log.as_ref(), true)?;
            let tls = tls_cert.zip(tls_key);
            let server = Server::start(ServerConfig { listen, push, db, tls }).await?;
            println!("egress-chat server: egress on {}, push on {}", server.ws_addr(), server.push_addr());
            tokio::select! {
                ended = server.run() => ended,
                _ = tokio::signal::ctrl_c() => Ok(()),
            }
        }
        None => {
            logging(cli.log.as_ref(), false)?;
            let db = cli.db.clone().unwrap_or_else(|| PathBuf::from(format!("egress-chat-{}.db", cli.name)));
            let config = ClientConfig {
                name: cli.name,
                rooms: cli.rooms,
                server: cli.server,
                push: cli.push,
                db,
                tls_ca: cli.tls_ca,
            };
            run_client(config).await
        }
    }
}

/// Logs to `file`; without one, to standard error for the server and
/// nowhere for the client (the screen is the terminal's).
fn logging(file: Option<&PathBuf>, server: bool) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    match file {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("opening {}", path.display()))?;
            tracing_subscriber::fmt().with_env_filter(filter).with_writer(Mutex::new(file)).with_ansi(false).init();
        }
        None if server => tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init(),
        None => {}
    }
    Ok(())
}

type Screen = Terminal<CrosstermBackend<Stdout>>;

/// The client with its screen: the terminal in raw mode on the alternate
/// screen, restored whatever happens.
async fn run_client(config: ClientConfig) -> anyhow::Result<()> {
    let cx = AsyncContext::new();
    let client = Arc::new(Client::start(&cx, config).await?);
    crossterm::terminal::enable_raw_mode()?;
    crossterm::execute!(std::io::stdout(), crossterm::terminal::EnterAlternateScreen)?;
    let terminal = Terminal::new(CrosstermBackend::new(std::io::stdout()))?;
    let result = session(&cx, &client, terminal).await;
    let _ = crossterm::terminal::disable_raw_mode();
    let _ = crossterm::execute!(std::io::stdout(), crossterm::terminal::LeaveAlternateScreen);
    if let Ok(client) = Arc::try_unwrap(client) {
        client.shutdown().await;
    }
    result
}

/// Draws from one effect and feeds the keys to the client until the user
/// quits.
async fn session(cx: &AsyncContext, client: &Arc<Client>, terminal: Screen) -> anyhow::Result<()> {
    let input =
        Input { text: cx.signal(String::new()), debug: cx.signal(false), redraws: cx.signal(0), clock: cx.signal(0) };
    let shown = cx.computed({
        let (client, input) = (client.clone(), input.clone());
        move || view(&client, &input)
    });
    let drawn = Arc::new(AtomicU64::new(0));
    let terminal = Arc::new(Mutex::new(terminal));
    // The screen: redrawn when the view changed, and only then.
    let _redraw = cx.effect({
        let (terminal, drawn, shown) = (terminal.clone(), drawn.clone(), shown.clone());
        move || {
            let view = shown.get();
            if let Ok(mut terminal) = terminal.lock()
                && terminal.draw(|frame| render(frame, &view)).is_ok()
            {
                drawn.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    // Redraws per second, for the overlay (a signal: shown only when it
    // changed, and only while the overlay is on).
    let meter = tokio::spawn({
        let (redraws, drawn) = (input.redraws.clone(), drawn.clone());
        async move {
            let mut last = drawn.load(Ordering::Relaxed);
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let now = drawn.load(Ordering::Relaxed);
                redraws.set(now.saturating_sub(last));
                last = drawn.load(Ordering::Relaxed);
            }
        }
    });
    // The clock's tick: changes nothing on screen unless a countdown is
    // shown (the view reads the clock only then).
    let ticker = tokio::spawn({
        let clock = input.clock.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                clock.update(|t| *t = t.wrapping_add(1));
            }
        }
    });
    let mut events = EventStream::new();
    let result = loop {
        let Some(event) = events.next().await else { break Ok(()) };
        let quit = match event.context("reading the terminal")? {
            Event::Key(key) if key.kind != KeyEventKind::Release => !on_key(client, &input, key).await,
            Event::Resize(..) => {
                if let Ok(mut terminal) = terminal.lock() {
                    let view = shown.get_untracked();
                    let _ = terminal.draw(|frame| render(frame, &view));
                }
                false
            }
            _ => false,
        };
        if quit {
            break Ok(());
        }
    };
    meter.abort();
    ticker.abort();
    result
}

/// Acts on one key; `false` to quit.
async fn on_key(client: &Arc<Client>, input: &Input, key: KeyEvent) -> bool {
    let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
    let rooms = client.rooms().len();
    match key.code {
        KeyCode::Esc => return false,
        KeyCode::Char('c') if ctrl => return false,
        KeyCode::Char('o') if ctrl => {
            let online = client.online.get_untracked();
            client.set_online(!online).await;
        }
        KeyCode::Char('d') if ctrl => input.debug.update(|d| *d = !*d),
        // Load, to watch the redraws per second under it: 100 lines at once.
        KeyCode::Char('l') if ctrl => {
            let room = client.current.get_untracked();
            for i in 1..=100 {
                if let Err(e) = client.send(room, &format!("load {i}/100")).await {
                    client.notice.set(Some(format!("not sent: {e:#}")));
                    break;
                }
            }
        }
        KeyCode::Tab => client.show((client.current.get_untracked() + 1) % rooms),
        KeyCode::BackTab => client.show((client.current.get_untracked() + rooms - 1) % rooms),
        KeyCode::Enter => {
            let text = input.text.get_untracked();
            if !text.trim().is_empty() {
                input.text.set(String::new());
                let room = client.current.get_untracked();
                match client.send(room, &text).await {
                    Ok(_) => client.notice.set(None),
                    Err(e) => client.notice.set(Some(format!("not sent: {e:#}"))),
                }
            }
        }
        KeyCode::Backspace => input.text.update(|t| {
            t.pop();
        }),
        KeyCode::Char(c) if !ctrl => input.text.update(|t| t.push(c)),
        _ => {}
    }
    true
}
