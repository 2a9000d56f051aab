//! The admin HTTP thread's link to core 0: requests on a crossbeam channel, a doorbell socket that
//! wakes core 0, and core 0's side that answers them.

use crate::cores::every_core::{gather_stats, set_everywhere};
use crate::cores::mesh::Setting;
use crate::cores::Core;
use crate::stats::CoreSnapshot;
use crate::table::TopicTable;
use futures_lite::AsyncReadExt;
use std::io::Write;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::os::unix::net::UnixStream;
use std::rc::Rc;
use std::sync::Arc;

/// A request from the admin HTTP thread to core 0, with the channel its answer goes back on.
#[derive(Debug)]
pub enum AdminRequest {
    /// Every core's figures.
    Stats(crossbeam_channel::Sender<Vec<CoreSnapshot>>),
    /// Every core's figures without each partition's: the console's samples.
    Sample(crossbeam_channel::Sender<Vec<CoreSnapshot>>),
    /// Every core's figures and the topic table.
    Status(crossbeam_channel::Sender<(Vec<CoreSnapshot>, TopicTable)>),
    /// A live setting, answered once every core has applied it.
    Set(Setting, crossbeam_channel::Sender<()>),
    /// The live settings in effect (core 0's: every core applies each change).
    Settings(crossbeam_channel::Sender<Vec<Setting>>),
}

/// The admin thread's end of its link to core 0: requests on a crossbeam channel, each followed by
/// a byte on a doorbell socket that core 0's executor awaits like any other socket, so core 0 sleeps
/// while no admin request comes and wakes at once when one does.
#[derive(Debug, Clone)]
pub struct AdminSender {
    requests: crossbeam_channel::Sender<AdminRequest>,
    doorbell: Arc<UnixStream>,
}

/// Core 0's end of the link, moved into its executor and served by [`serve_admin`].
#[derive(Debug)]
pub struct AdminInbox {
    pub(crate) requests: crossbeam_channel::Receiver<AdminRequest>,
    doorbell: UnixStream,
}

/// A link from the admin thread to core 0 that holds at most `capacity` waiting requests.
pub fn admin_link(capacity: usize) -> std::io::Result<(AdminSender, AdminInbox)> {
    let (ring, doorbell) = UnixStream::pair()?;
    ring.set_nonblocking(true)?;
    doorbell.set_nonblocking(true)?;
    let (requests, inbox) = crossbeam_channel::bounded(capacity);
    let sender = AdminSender {
        requests,
        doorbell: Arc::new(ring),
    };
    Ok((
        sender,
        AdminInbox {
            requests: inbox,
            doorbell,
        },
    ))
}

impl AdminSender {
    /// Queues `request` for core 0 and wakes it; `false` if the queue is full or core 0 is gone.
    pub fn send(&self, request: AdminRequest) -> bool {
        if self.requests.try_send(request).is_err() {
            return false;
        }
        // A doorbell too full to take a byte has rings pending: core 0 looks at the queue anyway.
        let _ = (&*self.doorbell).write(&[1]);
        true
    }
}

/// Core 0's end of the admin link, until the core stops: takes the waiting requests with `try_recv`
/// (never blocking the executor) whenever the doorbell rings, and answers each in its own task. An
/// answer the admin thread no longer waits for is dropped.
pub async fn serve_admin(core: Rc<Core>, inbox: AdminInbox) {
    // SAFETY: the doorbell socket is owned by `inbox` and handed over to the glommio stream.
    let mut doorbell =
        unsafe { glommio::net::UnixStream::from_raw_fd(inbox.doorbell.into_raw_fd()) };
    let mut rings = [0u8; 256];
    loop {
        while let Ok(request) = inbox.requests.try_recv() {
            let core = core.clone();
            glommio::spawn_local(async move { answer_admin(&core, request).await }).detach();
        }
        let rang = async { matches!(doorbell.read(&mut rings).await, Ok(n) if n > 0) };
        if core.until_stopping(rang).await != Some(true) {
            return;
        }
    }
}

async fn answer_admin(core: &Rc<Core>, request: AdminRequest) {
    match request {
        AdminRequest::Stats(reply) => {
            let _ = reply.try_send(gather_stats(core, true).await);
        }
        AdminRequest::Sample(reply) => {
            let _ = reply.try_send(gather_stats(core, false).await);
        }
        AdminRequest::Status(reply) => {
            let stats = gather_stats(core, true).await;
            let table = (*core.topics()).clone();
            let _ = reply.try_send((stats, table));
        }
        AdminRequest::Set(setting, reply) => {
            set_everywhere(core, setting).await;
            let _ = reply.try_send(());
        }
        AdminRequest::Settings(reply) => {
            let _ = reply.try_send(core.settings());
        }
    }
}
