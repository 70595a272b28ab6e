//! The change streams: a storage node publishes the committed changes of
//! the tables flows read to NATS JetStream, so that flow nodes on other
//! machines read them by position.
//!
//! One stream, [`STREAM`], holds every storage node's changes; each table
//! has its own subject, [`subject`] (the storage node's id in hex, then the
//! table's id). A message is one part of one commit's changes to one table:
//! its body is opaque here (the database encodes it), its headers carry the
//! position after it ([`SEQ_HEADER`], [`PART_HEADER`]) and a message id
//! made of the subject and the position, so that JetStream drops a part
//! published twice (a publisher that restarted between publishing and
//! hearing the acknowledgement). A publisher publishes a table's parts one
//! after another, each once the previous one is acknowledged (stored): the
//! stream holds each table's parts in commit order without gaps.

use async_nats::jetstream::{self, stream};
use async_nats::HeaderMap;
use snafu::{ResultExt, Snafu};
use std::time::Duration;

/// The stream of every storage node's changes.
pub const STREAM: &str = "SANDFLOW_CHANGES";
/// Header: the commit sequence of the position after the message.
pub const SEQ_HEADER: &str = "Sandflow-Seq";
/// Header: the part of the position after the message (`4294967295`: the
/// commit's last part).
pub const PART_HEADER: &str = "Sandflow-Part";

/// The subject of a table's changes on storage node `node`.
pub fn subject(node: &str, table: u64) -> String {
    format!("sandflow.changes.{}.{table}", hex::encode(node))
}

/// Errors of the change streams.
#[derive(Debug, Snafu)]
pub enum StreamError {
    #[snafu(display(
        "cannot reach NATS at {url}: {source}; check --nats and that nats-server runs with JetStream (-js)"
    ))]
    NatsConnect {
        url: String,
        source: async_nats::ConnectError,
    },
    #[snafu(display("JetStream did not {what}: {message}; is nats-server started with -js?"))]
    JetStream { what: String, message: String },
    #[snafu(display("the change stream holds a message without a position on {subject}"))]
    NoPosition { subject: String },
}

pub type StreamResult<T> = std::result::Result<T, StreamError>;

fn js_err(what: &str) -> impl FnOnce(String) -> StreamError + '_ {
    move |message| StreamError::JetStream {
        what: what.to_string(),
        message,
    }
}

/// A connection to the change streams.
#[derive(Clone)]
pub struct ChangeStreams {
    js: jetstream::Context,
    stream: stream::Stream,
}

impl std::fmt::Debug for ChangeStreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChangeStreams")
    }
}

/// One part of a table's changes, as the stream holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamPart {
    /// The position after this part: commit sequence and part.
    pub seq: u64,
    pub part: u32,
    pub body: bytes::Bytes,
}

fn position_of(headers: Option<&HeaderMap>, subject: &str) -> StreamResult<(u64, u32)> {
    let get = |name: &str| {
        headers
            .and_then(|h| h.get(name))
            .and_then(|v| v.as_str().parse::<u64>().ok())
    };
    match (get(SEQ_HEADER), get(PART_HEADER)) {
        (Some(seq), Some(part)) if part <= u32::MAX as u64 => Ok((seq, part as u32)),
        _ => NoPositionSnafu { subject }.fail(),
    }
}

impl ChangeStreams {
    /// Connects to NATS at `url` and makes sure the stream exists (file
    /// storage, a two-minute window for dropping duplicates).
    pub async fn connect(url: &str) -> StreamResult<ChangeStreams> {
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(5))
            .name("sandflow")
            .connect(url)
            .await
            .context(NatsConnectSnafu { url })?;
        let js = jetstream::new(client);
        let stream = js
            .get_or_create_stream(stream::Config {
                name: STREAM.to_string(),
                subjects: vec!["sandflow.changes.>".to_string()],
                storage: stream::StorageType::File,
                duplicate_window: Duration::from_secs(120),
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string())
            .map_err(js_err("open the change stream"))?;
        Ok(ChangeStreams { js, stream })
    }

    /// Publishes one part and waits until JetStream has stored it.
    pub async fn publish(
        &self,
        subject: &str,
        seq: u64,
        part: u32,
        body: Vec<u8>,
    ) -> StreamResult<()> {
        let mut headers = HeaderMap::new();
        headers.insert(SEQ_HEADER, seq.to_string().as_str());
        headers.insert(PART_HEADER, part.to_string().as_str());
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            format!("{subject}.{seq}.{part}").as_str(),
        );
        let ack = self
            .js
            .publish_with_headers(subject.to_string(), headers, body.into())
            .await
            .map_err(|e| e.to_string())
            .map_err(js_err("take a change"))?;
        ack.await
            .map_err(|e| e.to_string())
            .map_err(js_err("store a change"))?;
        Ok(())
    }

    /// The position after the last part on `subject`, if it has any.
    pub async fn last(&self, subject: &str) -> StreamResult<Option<(u64, u32)>> {
        match self.stream.get_last_raw_message_by_subject(subject).await {
            Ok(m) => position_of(Some(&m.headers), subject).map(Some),
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(e.to_string()).map_err(js_err("tell the last change")),
        }
    }

    /// Follows `subject` from its start: every part whose position is after
    /// `after`, in stream order, and then each new one as it is stored,
    /// until the returned stream is dropped (an ordered consumer, which
    /// NATS recreates by itself after a connection loss).
    pub async fn follow(
        &self,
        subject: &str,
        after: (u64, u32),
    ) -> StreamResult<impl futures_util::Stream<Item = StreamResult<StreamPart>> + Send + use<>>
    {
        use futures_util::StreamExt;
        let consumer = self
            .stream
            .create_consumer(jetstream::consumer::pull::OrderedConfig {
                filter_subject: subject.to_string(),
                deliver_policy: jetstream::consumer::DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string())
            .map_err(js_err("open a reader of the change stream"))?;
        let messages = consumer
            .messages()
            .await
            .map_err(|e| e.to_string())
            .map_err(js_err("read the change stream"))?;
        let subject = subject.to_string();
        Ok(messages.filter_map(move |m| {
            let subject = subject.clone();
            async move {
                let m = match m {
                    Ok(m) => m,
                    Err(e) => {
                        return Some(Err(StreamError::JetStream {
                            what: "read the change stream".into(),
                            message: e.to_string(),
                        }))
                    }
                };
                match position_of(m.headers.as_ref(), &subject) {
                    Ok((seq, part)) if (seq, part) > after => Some(Ok(StreamPart {
                        seq,
                        part,
                        body: m.payload.clone(),
                    })),
                    Ok(_) => None,
                    Err(e) => Some(Err(e)),
                }
            }
        }))
    }

    /// Every part on `subject` whose position is after `after`, in stream
    /// order (for readers that catch up; at most `max` parts).
    pub async fn read_after(
        &self,
        subject: &str,
        after: (u64, u32),
        max: usize,
    ) -> StreamResult<Vec<StreamPart>> {
        use futures_util::StreamExt;
        let mut consumer = self
            .stream
            .create_consumer(jetstream::consumer::pull::Config {
                filter_subject: subject.to_string(),
                deliver_policy: jetstream::consumer::DeliverPolicy::All,
                ack_policy: jetstream::consumer::AckPolicy::None,
                inactive_threshold: Duration::from_secs(60),
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string())
            .map_err(js_err("open a reader of the change stream"))?;
        let pending = consumer
            .info()
            .await
            .map_err(|e| e.to_string())
            .map_err(js_err("tell the length of the change stream"))?
            .num_pending as usize;
        let mut messages = consumer
            .fetch()
            .max_messages(pending.clamp(1, 10_000))
            .expires(Duration::from_secs(5))
            .messages()
            .await
            .map_err(|e| e.to_string())
            .map_err(js_err("read the change stream"))?;
        let mut out = Vec::new();
        let mut seen = 0usize;
        while seen < pending && out.len() < max {
            let Some(m) = messages.next().await else {
                break;
            };
            let m = m
                .map_err(|e| e.to_string())
                .map_err(js_err("read the change stream"))?;
            seen += 1;
            let (seq, part) = position_of(m.headers.as_ref(), subject)?;
            if (seq, part) > after {
                out.push(StreamPart {
                    seq,
                    part,
                    body: m.payload.clone(),
                });
            }
        }
        Ok(out)
    }
}
