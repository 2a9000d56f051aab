// kafkajs against shoal, driven by tests/it/kafkajs.rs:
//
//   node kafkajs.js <scenario> <bootstrap> <topic>
//
// with NODE_PATH naming the node_modules kafkajs is installed in (tests/it/common/node.rs). Prints one
// line of JSON on stdout, what the scenario saw; kafkajs's own log goes to stderr. Every wait is
// bounded: the whole script gives up after SCRIPT_TIMEOUT_MS, printing {"error": ...}.
'use strict';

const { Kafka, logLevel } = require('kafkajs');

const SCRIPT_TIMEOUT_MS = 90000;
const [scenario, bootstrap, topic] = process.argv.slice(2);

// kafkajs logs to stdout by default: to stderr here, stdout is the JSON result.
const logCreator = () => ({ namespace, level, log }) => {
  const { message, ...extra } = log;
  process.stderr.write(`kafkajs ${namespace} ${level}: ${message} ${JSON.stringify(extra)}\n`);
};

const kafka = new Kafka({
  clientId: `shoal-test-${scenario}`,
  brokers: bootstrap.split(','),
  logLevel: logLevel.WARN,
  logCreator,
  connectionTimeout: 10000,
  requestTimeout: 30000,
  retry: { retries: 5, initialRetryTime: 100, maxRetryTime: 2000 },
});

const values = (prefix, n) => Array.from({ length: n }, (_, i) => `${prefix}-${i}`);

// Messages for both partitions, alternating, so every transaction spans both (both cores).
const messages = (vals) => vals.map((value, i) => ({ value, partition: i % 2 }));

function withTimeout(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

// Consumes `topic` from the beginning in a group of its own until `done(values)` holds, then
// lingers `lingerMs` more (to see anything that should not come); the values in arrival order.
async function consume({ readUncommitted, done, lingerMs = 1000, timeoutMs = 30000 }) {
  const consumer = kafka.consumer({
    groupId: `g-${scenario}-${readUncommitted ? 'uncommitted' : 'committed'}-${process.pid}`,
    readUncommitted,
    maxWaitTimeInMs: 200,
    sessionTimeout: 10000,
    heartbeatInterval: 1000,
  });
  const seen = [];
  let resolveDone;
  const finished = new Promise((resolve) => {
    resolveDone = resolve;
  });
  try {
    await withTimeout(consumer.connect(), 15000, 'consumer connect');
    await withTimeout(
      consumer.subscribe({ topics: [topic], fromBeginning: true }),
      15000,
      'subscribe',
    );
    await consumer.run({
      eachMessage: async ({ partition, message }) => {
        seen.push({ partition, offset: Number(message.offset), value: message.value.toString() });
        if (done(seen.map((m) => m.value))) resolveDone();
      },
    });
    await withTimeout(finished, timeoutMs, `consuming (${seen.length} seen)`);
    await new Promise((resolve) => setTimeout(resolve, lingerMs));
  } finally {
    await withTimeout(consumer.disconnect(), 15000, 'consumer disconnect').catch(() => {});
  }
  return seen.map((m) => m.value);
}

// a. A plain producer and a consumer group: what was sent comes back.
async function roundtrip() {
  const producer = kafka.producer();
  await withTimeout(producer.connect(), 15000, 'producer connect');
  const sent = values('plain', 20);
  await withTimeout(producer.send({ topic, messages: messages(sent) }), 30000, 'send');
  await producer.disconnect();
  const received = await consume({
    readUncommitted: false,
    done: (got) => got.length >= sent.length,
    lingerMs: 200,
  });
  return { sent, received };
}

function transactionalProducer(transactionalId) {
  return kafka.producer({ transactionalId, idempotent: true, maxInFlightRequests: 1 });
}

// b. A transaction committed, one aborted, another committed; then what a read_committed consumer
// and a read_uncommitted one see.
async function transactions() {
  const producer = transactionalProducer(`tx-${topic}`);
  await withTimeout(producer.connect(), 15000, 'producer connect');
  const committed = values('committed', 6);
  const aborted = values('aborted', 6);
  const after = values('after', 6);
  for (const [vals, commit] of [
    [committed, true],
    [aborted, false],
    [after, true],
  ]) {
    const t = await withTimeout(producer.transaction(), 30000, 'begin a transaction');
    await withTimeout(t.send({ topic, messages: messages(vals) }), 30000, 'send in a transaction');
    await withTimeout(commit ? t.commit() : t.abort(), 30000, commit ? 'commit' : 'abort');
  }
  await producer.disconnect();
  const all = committed.length + aborted.length + after.length;
  // The last committed records lie after the aborted ones on both partitions: once they are all
  // seen, any aborted record that leaked through has been seen too.
  const readCommitted = await consume({
    readUncommitted: false,
    done: (got) => after.every((v) => got.includes(v)),
  });
  const readUncommitted = await consume({
    readUncommitted: true,
    done: (got) => got.length >= all,
  });
  return { committed: [...committed, ...after], aborted, readCommitted, readUncommitted };
}

// c. Two producers with one transactional id: the second's initialisation fences the first, whose
// commit then fails.
async function fencing() {
  const id = `tx-fenced-${topic}`;
  const older = transactionalProducer(id);
  await withTimeout(older.connect(), 15000, 'older producer connect');
  const t = await withTimeout(older.transaction(), 30000, 'older: begin');
  await withTimeout(t.send({ topic, messages: messages(values('older', 2)) }), 30000, 'older: send');
  const newer = transactionalProducer(id);
  await withTimeout(newer.connect(), 15000, 'newer producer connect');
  const t2 = await withTimeout(newer.transaction(), 30000, 'newer: begin');
  let olderCommit;
  try {
    await withTimeout(t.commit(), 30000, 'older: commit');
    olderCommit = { ok: true };
  } catch (e) {
    olderCommit = { ok: false, name: e.name, type: e.type || null, message: e.message };
  }
  await withTimeout(t2.send({ topic, messages: messages(values('newer', 2)) }), 30000, 'newer: send');
  await withTimeout(t2.commit(), 30000, 'newer: commit');
  await older.disconnect().catch(() => {});
  await newer.disconnect();
  const readCommitted = await consume({
    readUncommitted: false,
    done: (got) => values('newer', 2).every((v) => got.includes(v)),
  });
  return { olderCommit, readCommitted };
}

const scenarios = { roundtrip, transactions, fencing };

async function main() {
  const run = scenarios[scenario];
  if (!run) throw new Error(`unknown scenario ${scenario}`);
  return withTimeout(run(), SCRIPT_TIMEOUT_MS, scenario);
}

main().then(
  (result) => {
    process.stdout.write(`${JSON.stringify(result)}\n`);
    process.exit(0);
  },
  (e) => {
    process.stdout.write(`${JSON.stringify({ error: `${e.name}: ${e.message}`, type: e.type || null })}\n`);
    process.exit(1);
  },
);
