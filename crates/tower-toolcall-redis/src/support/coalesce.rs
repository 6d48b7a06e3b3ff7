//! Checks of one key that arrive while a script for that key is in flight wait, and go
//! together, in arrival order, in the next script for that key.
//!
//! A lone check runs at once on its caller's task: one round trip, nothing spawned. Checks
//! that arrive meanwhile queue; when the script in flight answers, a task sends the whole
//! queue in one script, and then the queue that built up during that one, until none is
//! left. Each check waits at most the operation timeout, counted from its arrival; a check
//! whose caller has gone before its turn is not sent; a failed script fails every check it
//! carried, each with the same error. A script carries at most [`MAX_BATCH`] checks, so that
//! none holds the server for long; the rest go in the scripts after it.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::mem;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

use tower_toolcall::shared_store::StoreError;

/// The most checks one script carries: a script runs alone on the server, and one carrying
/// thousands of checks would hold every other client up.
pub(crate) const MAX_BATCH: usize = 256;

/// A check waiting for its turn, and where its answer goes.
type Waiter<M, A> = (M, oneshot::Sender<Result<A, StoreError>>);

/// The keys with a script in flight, and the checks waiting for the next one.
pub(crate) struct Coalescer<K, M, A> {
    waiting: Mutex<HashMap<K, Vec<Waiter<M, A>>>>,
}

impl<K, M, A> Default for Coalescer<K, M, A> {
    fn default() -> Self {
        Coalescer {
            waiting: Mutex::new(HashMap::new()),
        }
    }
}

/// A store whose checks of one key go together in one script.
pub(crate) trait Batch: Send + Sync + Sized + 'static {
    /// What names the state a script works on.
    type Key: Hash + Eq + Clone + Send + Sync + 'static;
    /// One check.
    type Member: Send + 'static;
    /// What one check answers.
    type Answer: Send + 'static;

    fn coalescer(&self) -> &Coalescer<Self::Key, Self::Member, Self::Answer>;

    /// The time one check may wait for its answer.
    fn timeout(&self) -> Duration;

    /// Runs one script for `members` of `key`, in arrival order: one answer each, in order.
    fn run(
        &self,
        key: &Self::Key,
        members: Vec<Self::Member>,
    ) -> impl Future<Output = Result<Vec<Self::Answer>, StoreError>> + Send;
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Checks `member` of `key`: at once when no script for `key` is in flight, otherwise in the
/// next one.
pub(crate) async fn check<B: Batch>(
    batch: Arc<B>,
    key: B::Key,
    member: B::Member,
) -> Result<B::Answer, StoreError> {
    let queued = {
        let mut waiting = lock(&batch.coalescer().waiting);
        match waiting.get_mut(&key) {
            Some(queue) => {
                let (sender, receiver) = oneshot::channel();
                queue.push((member, sender));
                Err(receiver)
            }
            None => {
                waiting.insert(key.clone(), Vec::new());
                Ok(member)
            }
        }
    };
    let member = match queued {
        Ok(member) => member,
        Err(receiver) => {
            let timeout = batch.timeout();
            return match tokio::time::timeout(timeout, receiver).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(_)) => Err(StoreError::Unavailable(
                    "the check was dropped before the store was asked".to_owned(),
                )),
                Err(_) => Err(StoreError::Timeout(timeout)),
            };
        }
    };
    let turn = Turn {
        batch: batch.clone(),
        key: Some(key),
    };
    let answers = batch.run(turn.key(), vec![member]).await;
    drop(turn);
    answers.and_then(|mut answers| match (answers.pop(), answers.is_empty()) {
        (Some(answer), true) => Ok(answer),
        _ => Err(miscounted()),
    })
}

fn miscounted() -> StoreError {
    StoreError::Corrupt("a script answered a batch with the wrong count".to_owned())
}

/// The script in flight for `key`: when it ends (answered or dropped), the checks that
/// queued meanwhile go in the next one, sent by a task of their own.
struct Turn<B: Batch> {
    batch: Arc<B>,
    key: Option<B::Key>,
}

impl<B: Batch> Turn<B> {
    fn key(&self) -> &B::Key {
        self.key.as_ref().expect("a turn has its key until it ends")
    }

    /// The checks waiting for `key`, the first [`MAX_BATCH`] of them; none when the turn
    /// ends, and with it `key`'s entry.
    fn next(&mut self) -> Vec<Waiter<B::Member, B::Answer>> {
        let mut waiting = lock(&self.batch.coalescer().waiting);
        let key = self.key();
        let queue = match waiting.get_mut(key) {
            Some(queue) if queue.len() > MAX_BATCH => queue.drain(..MAX_BATCH).collect(),
            Some(queue) => mem::take(queue),
            None => Vec::new(),
        };
        if queue.is_empty() {
            waiting.remove(key);
            drop(waiting);
            self.key = None;
        }
        queue
    }
}

impl<B: Batch> Drop for Turn<B> {
    fn drop(&mut self) {
        if self.key.is_none() {
            return;
        }
        let queue = self.next();
        let Some(key) = self.key.take() else {
            return;
        };
        let batch = self.batch.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(drive(batch, key, queue));
            }
            // No runtime to send them: the waiting checks fail, and the key is free again.
            Err(_) => {
                lock(&batch.coalescer().waiting).remove(&key);
            }
        }
    }
}

/// Sends `queue`, then each queue that builds up meanwhile, until none is left.
async fn drive<B: Batch>(batch: Arc<B>, key: B::Key, mut queue: Vec<Waiter<B::Member, B::Answer>>) {
    let mut turn = Turn {
        batch: batch.clone(),
        key: Some(key),
    };
    while !queue.is_empty() {
        // Callers that have gone are not counted.
        let (members, senders): (Vec<_>, Vec<_>) = queue
            .into_iter()
            .filter(|(_, sender)| !sender.is_closed())
            .unzip();
        if !members.is_empty() {
            let count = members.len();
            match batch.run(turn.key(), members).await {
                Ok(answers) if answers.len() == count => {
                    for (sender, answer) in senders.into_iter().zip(answers) {
                        let _ = sender.send(Ok(answer));
                    }
                }
                Ok(_) => answer_all(senders, &miscounted()),
                Err(error) => answer_all(senders, &error),
            }
        }
        queue = turn.next();
    }
}

fn answer_all<A>(senders: Vec<oneshot::Sender<Result<A, StoreError>>>, error: &StoreError) {
    for sender in senders {
        let _ = sender.send(Err(error.clone()));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Answers each check with its own number and records the size of every script.
    #[derive(Default)]
    struct Counting {
        coalescer: Coalescer<u8, usize, usize>,
        scripts: Mutex<Vec<usize>>,
        running: AtomicUsize,
    }

    impl Batch for Counting {
        type Key = u8;
        type Member = usize;
        type Answer = usize;

        fn coalescer(&self) -> &Coalescer<u8, usize, usize> {
            &self.coalescer
        }

        fn timeout(&self) -> Duration {
            Duration::from_secs(60)
        }

        async fn run(&self, _key: &u8, members: Vec<usize>) -> Result<Vec<usize>, StoreError> {
            assert_eq!(
                self.running.fetch_add(1, Ordering::SeqCst),
                0,
                "one script at a time"
            );
            lock(&self.scripts).push(members.len());
            tokio::time::sleep(Duration::from_millis(1)).await;
            self.running.fetch_sub(1, Ordering::SeqCst);
            Ok(members)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn no_script_carries_more_than_max_batch_and_every_check_gets_its_own_answer() {
        let batch = Arc::new(Counting::default());
        let checks = 3 * MAX_BATCH + 10;
        let tasks: Vec<_> = (0..checks)
            .map(|n| tokio::spawn(check(batch.clone(), 7, n)))
            .collect();
        for (n, task) in tasks.into_iter().enumerate() {
            assert_eq!(task.await.unwrap().unwrap(), n);
        }
        let scripts = lock(&batch.scripts).clone();
        assert_eq!(scripts.iter().sum::<usize>(), checks);
        assert!(scripts.iter().all(|&size| size <= MAX_BATCH), "{scripts:?}");
        assert_eq!(
            scripts.iter().filter(|&&size| size == MAX_BATCH).count(),
            3,
            "{scripts:?}"
        );
        assert!(lock(&batch.coalescer.waiting).is_empty());
    }
}
