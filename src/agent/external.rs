//! An agent in another process: `--agent 'cmd args'` starts it with `sh -c`, writes one JSON
//! request per line to its stdin and reads one JSON reply per line from its stdout. The protocol
//! (fact-agent/2) is documented in README.md and docs/agent-protocol.schema.json.

use super::{Agent, AgentError, FailureAction, RankItem, Rejection};
use crate::space::examples::Example;
use crate::types::{Arch, MathType};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

pub const PROTOCOL: &str = "fact-agent/2";

pub struct ExternalAgent {
    command: String,
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    timeout: Duration,
    next_id: u64,
}

impl ExternalAgent {
    pub fn start(command: &str, timeout: Duration) -> Result<ExternalAgent, AgentError> {
        // Its own process group, so that ending the agent ends whatever `sh -c` started too.
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(command)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| AgentError::Start(format!("{command}: {e}")))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(ExternalAgent {
            command: command.to_string(),
            child,
            stdin,
            lines,
            timeout,
            next_id: 1,
        })
    }

    fn request(&mut self, kind: &str, body: Value) -> Result<Value, AgentError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut msg = json!({ "protocol": PROTOCOL, "id": id, "kind": kind });
        if let (Some(m), Some(b)) = (msg.as_object_mut(), body.as_object()) {
            m.extend(b.clone());
        }
        let line = serde_json::to_string(&msg).expect("request serializes");
        if writeln!(self.stdin, "{line}")
            .and_then(|_| self.stdin.flush())
            .is_err()
        {
            return Err(AgentError::Crashed(self.exit_status()));
        }
        let reply = match self.lines.recv_timeout(self.timeout) {
            Ok(l) => l,
            Err(RecvTimeoutError::Timeout) => return Err(AgentError::Timeout(self.timeout)),
            Err(RecvTimeoutError::Disconnected) => {
                return Err(AgentError::Crashed(self.exit_status()))
            }
        };
        let v: Value = serde_json::from_str(&reply)
            .map_err(|e| AgentError::Malformed(format!("{e}: {reply}")))?;
        if v.get("id").and_then(Value::as_u64) != Some(id) {
            return Err(AgentError::Malformed(format!(
                "reply to request {id} carries id {:?}",
                v.get("id")
            )));
        }
        if let Some(err) = v.get("error").and_then(Value::as_str) {
            return Err(AgentError::Malformed(format!(
                "the agent reported an error: {err}"
            )));
        }
        Ok(v)
    }

    fn exit_status(&mut self) -> String {
        match self.child.try_wait() {
            Ok(Some(s)) => s.to_string(),
            _ => "stdout closed".into(),
        }
    }
}

impl Drop for ExternalAgent {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--"])
            .arg(format!("-{}", self.child.id()))
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn field<'a>(v: &'a Value, name: &str) -> Result<&'a Value, AgentError> {
    v.get(name)
        .ok_or_else(|| AgentError::Malformed(format!("reply lacks '{name}'")))
}

fn strings(v: &Value, name: &str) -> Result<Vec<String>, AgentError> {
    serde_json::from_value(field(v, name)?.clone())
        .map_err(|e| AgentError::Malformed(format!("'{name}': {e}")))
}

impl Agent for ExternalAgent {
    fn name(&self) -> String {
        format!("external agent `{}`", self.command)
    }

    fn rank(&mut self, items: &[RankItem]) -> Result<Vec<String>, AgentError> {
        let v = self.request("rank", json!({ "patterns": items }))?;
        strings(&v, "order")
    }

    fn examples(
        &mut self,
        id: &str,
        rule: &str,
        arch: Arch,
        offered: &[Example],
    ) -> Result<Vec<String>, AgentError> {
        let v = self.request(
            "examples",
            json!({ "pattern": id, "rule": rule, "arch": arch, "offered": offered }),
        )?;
        strings(&v, "examples")
    }

    fn propose(
        &mut self,
        problem: &Value,
        rule: &str,
        math: MathType,
        arch: Arch,
        space: &[Value],
        rejected: &[Rejection],
    ) -> Result<Vec<Value>, AgentError> {
        let v = self.request(
            "propose",
            json!({ "problem": problem, "rule": rule, "math": math, "arch": arch, "space": space, "rejected": rejected }),
        )?;
        field(&v, "candidates")?
            .as_array()
            .cloned()
            .ok_or_else(|| AgentError::Malformed("'candidates' is not a list".into()))
    }

    fn after_failure(
        &mut self,
        problem: &Value,
        rule: &str,
        failures: &[(String, String)],
    ) -> Result<FailureAction, AgentError> {
        let failures: Vec<Value> = failures
            .iter()
            .map(|(k, s)| json!({ "kernel": k, "status": s }))
            .collect();
        let v = self.request(
            "after_failure",
            json!({ "problem": problem, "rule": rule, "failures": failures }),
        )?;
        serde_json::from_value(v).map_err(|e| AgentError::Malformed(format!("after_failure: {e}")))
    }
}
