//! A second protocol written against the executor alone, without zilla-nbd: a
//! line-based toy ("WRITE off hex", "READ off len", "FLUSH", "TRIM off len",
//! "SAME off len byte"; replies "OK", "DATA hex", "ERR errno", one per line, in
//! completion order with the request's tag first). It shows what a front end needs:
//! parse, admit, submit, encode the one completion. Budgets, the choice of path and
//! the statistics come from zilla-frontend.

use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use zilla_core::memvol::MemVolume;
use zilla_frontend::{Command, Completer, Completion, Executor, Frontend, FrontendConfig, Output, ReadData, Request, StaticRegistry, Submitted};

/// Sends one reply line to the connection's writer.
struct LineCompleter {
    tag: String,
    replies: mpsc::UnboundedSender<String>,
}

impl LineCompleter {
    fn line(&self, completion: Completion) -> String {
        match completion.result {
            Ok(Output::Data(ReadData::Copied(bytes))) => format!("{} DATA {}", self.tag, hex(&bytes)),
            Ok(Output::Data(ReadData::Shared(pieces))) => {
                format!("{} DATA {}", self.tag, pieces.iter().map(|p| hex(p.as_slice())).collect::<String>())
            }
            Ok(_) => format!("{} OK", self.tag),
            Err(error) => format!("{} ERR {}", self.tag, error.errno()),
        }
    }
}

impl Completer for LineCompleter {
    fn complete(self, completion: Completion) {
        let line = self.line(completion);
        let _ = self.replies.send(line);
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse(line: &str) -> Option<(String, Command)> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let number = |i: usize| words.get(i)?.parse::<u64>().ok();
    let command = match *words.get(1)? {
        "WRITE" => {
            let text = words.get(3)?;
            let data = (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect::<Option<Vec<u8>>>()?;
            Command::Write { offset: number(2)?, data: zilla_frontend::volume::WriteData::copy_of(&data), fua: false }
        }
        "READ" => Command::Read { offset: number(2)?, length: u32::try_from(number(3)?).ok()?, prefix_bytes: 0, holes: false },
        "FLUSH" => Command::Flush,
        "TRIM" => Command::Unmap { offset: number(2)?, length: number(3)?, fua: false },
        "SAME" => Command::WriteSame { offset: number(2)?, length: number(3)?, pattern: vec![number(4)? as u8; 512], fua: false },
        _ => return None,
    };
    Some((words[0].to_string(), command))
}

/// Serve one connection until EOF.
async fn serve(frontend: Arc<Frontend>, stream: tokio::io::DuplexStream) {
    let (read_half, mut write_half) = tokio::io::split(stream);
    let (replies, mut queued) = mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(async move {
        while let Some(line) = queued.recv().await {
            write_half.write_all(format!("{line}\n").as_bytes()).await.unwrap();
        }
    });
    let volume = Arc::new(MemVolume::new("toy/vol", 1 << 20, 4096));
    let executor = Executor::new(&frontend, volume, "toy/vol", 4, zilla_frontend::SessionLabels::anonymous("test"));
    let mut lines = BufReader::new(read_half).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Some((tag, command)) = parse(&line) else {
            executor.refuse(zilla_frontend::IoKind::Other, 0, executor.now_ns());
            let _ = replies.send("? ERR 22".into());
            continue;
        };
        let admission = executor.admit(64 << 10, || {}).await;
        let completer = || LineCompleter { tag: tag.clone(), replies: replies.clone() };
        let request = Request { command, started_ns: executor.now_ns() };
        match executor.submit(request, admission, &completer) {
            Submitted::Inline(completion) => completer().complete(completion),
            Submitted::Started => {}
            Submitted::Blocked(blocked) => executor.resume(blocked, || {}).await,
        }
    }
    executor.idle().await;
    drop(replies);
    writer.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_protocol_needs_only_the_executor() {
    let frontend = Frontend::new(Arc::new(StaticRegistry::new()), FrontendConfig::default());
    let (client, server) = tokio::io::duplex(1 << 16);
    let server = tokio::spawn(serve(frontend.clone(), server));
    let (client_read, mut client_write) = tokio::io::split(client);
    let script = "a WRITE 4096 00ff10\nb FLUSH\nc SAME 8192 1024 7\nd TRIM 0 512\nbogus\n";
    client_write.write_all(script.as_bytes()).await.unwrap();
    // one request at a time from here: the writes above are done once their replies are in
    let mut replies = BufReader::new(client_read).lines();
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(replies.next_line().await.unwrap().unwrap());
    }
    got.sort();
    assert_eq!(got, ["? ERR 22", "a OK", "b OK", "c OK", "d OK"]);
    client_write.write_all(b"e READ 4096 4\nf READ 9000 2\ng READ 2000000 1\n").await.unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(replies.next_line().await.unwrap().unwrap());
    }
    got.sort();
    assert_eq!(got, ["e DATA 00ff1000", "f DATA 0707", "g ERR 22"]);
    client_write.shutdown().await.unwrap();
    drop(client_write);
    server.await.unwrap();
    let stats = frontend.io_stats.volume_snapshot("toy/vol");
    assert_eq!((stats.read_ops, stats.write_ops, stats.flush_ops, stats.trim_ops), (3, 1, 1, 2), "{stats:?}");
    assert_eq!(stats.error_ops, 2, "the unparsable line and the read past the end: {stats:?}");
    assert_eq!(frontend.stats().memory.in_use, 0);
}
