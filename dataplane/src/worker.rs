//! A worker: one thread per (interface, queue), pinned to its core, owning
//! its AF_XDP port and its pipeline. Each loop iteration drains control
//! messages, reclaims and refills frames, receives a batch, runs every
//! frame through the pipeline, transmits the batch (and any ARP requests
//! the pipeline queued), and advances the conntrack timers by a bounded
//! amount.
//!
//! Poll modes: `busy` spins; `adaptive` spins while there is traffic and,
//! after a run of empty polls, sleeps in poll(2) on the socket and an
//! eventfd that the control side writes after sending a message, so
//! control messages wake it at once.

use std::sync::Arc;

use crossbeam_channel::Receiver;
use xsk_rs::FrameDesc;
use xvs_config::{PollMode, ServiceKey};

use crate::pipeline::{Counters, Pipeline, Verdict};
use crate::services::CompiledService;
use crate::xsk::{XskPort, BATCH};

/// Empty polls before an adaptive worker sleeps.
const SPIN_BEFORE_SLEEP: u32 = 256;
/// Longest sleep of an idle adaptive worker, in milliseconds.
const SLEEP_MS: i32 = 100;
/// Conntrack entries examined per loop iteration.
const EXPIRY_BUDGET: u32 = 256;

/// A message from the control side.
#[derive(Debug)]
pub enum Control {
    /// Add or replace a service.
    Upsert(Arc<CompiledService>),
    /// Remove a service.
    Remove(ServiceKey),
    /// Answer ARP and ping for an address (a VIP).
    Own(std::net::Ipv4Addr),
    /// Stop answering for an address.
    Disown(std::net::Ipv4Addr),
    /// Report a snapshot.
    Snapshot(crossbeam_channel::Sender<Snapshot>),
    /// Stop the worker.
    Stop,
}

/// What a worker reports.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Worker index.
    pub worker: usize,
    /// Pipeline counters.
    pub counters: Counters,
    /// Conntrack counters.
    pub conntrack: xvs_conntrack::Stats,
    /// Live flows.
    pub flows: u32,
    /// Frames (userspace, fill/RX, TX).
    pub frames: (u32, u32, u32),
    /// Whether every UMEM frame is accounted for.
    pub frames_accounted: bool,
    /// Loop iterations that received packets.
    pub busy: u64,
    /// Loop iterations that received nothing.
    pub idle: u64,
    /// Frames sent.
    pub tx: u64,
}

/// Everything a worker thread owns.
pub struct Worker {
    /// Index.
    pub index: usize,
    /// The pipeline.
    pub pipeline: Pipeline,
    /// The port.
    pub port: XskPort,
    /// Control messages.
    pub control: Receiver<Control>,
    /// Eventfd the control side writes to wake the worker.
    pub wake_fd: i32,
    /// Poll mode.
    pub poll: PollMode,
    busy: u64,
    idle: u64,
    tx: u64,
}

impl Worker {
    /// A worker ready to run.
    pub fn new(
        index: usize,
        pipeline: Pipeline,
        port: XskPort,
        control: Receiver<Control>,
        wake_fd: i32,
        poll: PollMode,
    ) -> Worker {
        Worker {
            index,
            pipeline,
            port,
            control,
            wake_fd,
            poll,
            busy: 0,
            idle: 0,
            tx: 0,
        }
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            worker: self.index,
            counters: *self.pipeline.counters(),
            conntrack: self.pipeline.table.stats(),
            flows: self.pipeline.table.len(),
            frames: self.port.frame_counts(),
            frames_accounted: self.port.frames_accounted(),
            busy: self.busy,
            idle: self.idle,
            tx: self.tx,
        }
    }

    /// Applies control messages; returns false on Stop.
    fn control(&mut self) -> bool {
        while let Ok(msg) = self.control.try_recv() {
            match msg {
                Control::Upsert(svc) => {
                    for b in &svc.backends {
                        self.pipeline.resolve(b.endpoint.addr);
                    }
                    self.pipeline.services.upsert(svc);
                }
                Control::Remove(key) => self.pipeline.services.remove(&key),
                Control::Own(a) => self.pipeline.own(a),
                Control::Disown(a) => self.pipeline.disown(a),
                Control::Snapshot(reply) => {
                    let _ = reply.send(self.snapshot());
                }
                Control::Stop => return false,
            }
        }
        true
    }

    /// Runs until stopped; returns the final snapshot.
    pub fn run(mut self, clock: impl Fn() -> u32) -> Snapshot {
        let mut rx = vec![FrameDesc::default(); BATCH];
        let mut out: Vec<FrameDesc> = Vec::with_capacity(BATCH * 2);
        let mut drop: Vec<FrameDesc> = Vec::with_capacity(BATCH);
        let mut empty_streak = 0u32;
        loop {
            if !self.control() {
                break;
            }
            let now = clock();
            self.port.reclaim();
            self.port.refill();
            let n = self.port.receive(&mut rx);
            if n == 0 {
                self.idle += 1;
                empty_streak += 1;
                self.send_arp(&mut out);
                if !out.is_empty() {
                    self.tx += self.port.transmit(&out) as u64;
                    out.clear();
                }
                self.pipeline.advance(now, EXPIRY_BUDGET);
                if self.poll == PollMode::Adaptive && empty_streak >= SPIN_BEFORE_SLEEP {
                    self.sleep();
                    empty_streak = 0;
                }
                continue;
            }
            empty_streak = 0;
            self.busy += 1;
            for desc in rx.iter_mut().take(n) {
                let pipeline = &mut self.pipeline;
                // SAFETY: `desc` was just received on this port and is
                // referenced nowhere else.
                let verdict = unsafe {
                    self.port
                        .with_frame(desc, |buf, len| pipeline.process(buf, len, now))
                };
                match verdict {
                    Verdict::Forward(len) | Verdict::Answer(len) => {
                        // SAFETY: as above; the frame is about to be sent.
                        unsafe { self.port.set_len(desc, len) };
                        out.push(*desc);
                    }
                    Verdict::Consumed | Verdict::Drop(_) => drop.push(*desc),
                }
            }
            self.port.release(&drop);
            drop.clear();
            self.send_arp(&mut out);
            self.tx += self.port.transmit(&out) as u64;
            out.clear();
            self.pipeline.advance(now, EXPIRY_BUDGET);
        }
        self.snapshot()
    }

    /// Builds the ARP requests the pipeline queued into free frames,
    /// appended to `out` for transmission.
    fn send_arp(&mut self, out: &mut Vec<FrameDesc>) {
        let targets: Vec<std::net::Ipv4Addr> = self.pipeline.drain_arp().collect();
        if targets.is_empty() {
            return;
        }
        for t in targets {
            let Some(mut desc) = self.port.alloc() else {
                break;
            };
            let pipeline = &self.pipeline;
            // SAFETY: a free frame of this port, referenced nowhere else.
            let len = unsafe {
                self.port
                    .with_frame(&mut desc, |buf, _| pipeline.build_arp_request(buf, t))
            };
            match len {
                Some(len) => {
                    // SAFETY: as above.
                    unsafe { self.port.set_len(&mut desc, len) };
                    out.push(desc);
                }
                None => self.port.release(&[desc]),
            }
        }
    }

    /// Sleeps until a packet arrives, a control message is signalled, or
    /// the sleep times out.
    fn sleep(&mut self) {
        let mut fds = [
            libc::pollfd {
                fd: self.port.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.wake_fd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfd for the call.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, SLEEP_MS) };
        if fds[1].revents & libc::POLLIN != 0 {
            let mut v = 0u64;
            // SAFETY: reads 8 bytes into `v` from the eventfd, which is
            // what an eventfd read is; nonblocking.
            unsafe { libc::read(self.wake_fd, (&mut v as *mut u64).cast(), 8) };
        }
    }
}
