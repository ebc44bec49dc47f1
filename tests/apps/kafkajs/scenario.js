// KafkaJS against `compactlog serve`: one step of tests/apps/test_apps_kafkajs.py per run.
//
//   node scenario.js BROKER STEP [ARGS...]
//
// Each step connects, does its work, prints its results to stdout as JSON lines and
// disconnects; an error is printed to stderr and exits 1. KafkaJS's own log goes to
// stderr. Steps:
//   create TOPIC PARTITIONS CONFIG_JSON    CreateTopics with configEntries
//   alter TOPIC CONFIG_JSON                AlterConfigs (KafkaJS has no incremental one)
//   describe TOPIC                         DescribeConfigs: {"configs": {name: value}}
//   list-topics                            Metadata: {"topics": [...]}
//   produce TOPIC ITEMS_JSON               [[key, value or null], ...] in one send:
//                                          {"partition", "baseOffset"} per partition
//   consume TOPIC GROUP EXPECTED           subscribe in GROUP from the earliest offset,
//                                          read EXPECTED records (one JSON line each),
//                                          commit the next offsets, leave
//   offsets TOPIC GROUP                    the group's committed offsets
//   watermarks TOPIC                       {"partition", "low", "high"} per partition
//   delete-records TOPIC PARTITION OFFSET  DeleteRecords up to OFFSET
//   delete-group GROUP                     DeleteGroups, then ListGroups
'use strict';

const { Kafka, logLevel, ConfigResourceTypes, Partitioners } = require('kafkajs');

const TIMEOUT_MS = 60000;

function out(object) {
  process.stdout.write(JSON.stringify(object) + '\n');
}

function kafka(broker) {
  return new Kafka({
    clientId: 'compactlog-kafkajs',
    brokers: [broker],
    connectionTimeout: 10000,
    requestTimeout: 30000,
    retry: { retries: 5, initialRetryTime: 100 },
    logLevel: logLevel.WARN,
    logCreator: () => ({ namespace, level, label, log }) => {
      const { message, ...extra } = log;
      process.stderr.write(`[kafkajs ${label}] ${namespace}: ${message} ${JSON.stringify(extra)}\n`);
    },
  });
}

async function withAdmin(client, work) {
  const admin = client.admin();
  await admin.connect();
  try {
    return await work(admin);
  } finally {
    await admin.disconnect();
  }
}

function entries(configJson) {
  return Object.entries(JSON.parse(configJson)).map(([name, value]) => ({ name, value: String(value) }));
}

async function describe(admin, topic) {
  const described = await admin.describeConfigs({
    includeSynonyms: false,
    resources: [{ type: ConfigResourceTypes.TOPIC, name: topic }],
  });
  const configs = {};
  for (const resource of described.resources) {
    if (resource.errorCode !== 0) {
      throw new Error(`DescribeConfigs ${topic}: error ${resource.errorCode} ${resource.errorMessage}`);
    }
    for (const entry of resource.configEntries) {
      configs[entry.configName] = entry.configValue;
    }
  }
  return configs;
}

async function consume(client, topic, group, expected) {
  const consumer = client.consumer({
    groupId: group,
    sessionTimeout: 10000,
    heartbeatInterval: 500,
    maxWaitTimeInMs: 200,
    retry: { retries: 5, initialRetryTime: 100 },
  });
  await consumer.connect();
  const next = {}; // partition -> the offset after the last record read
  let seen = 0;
  try {
    await consumer.subscribe({ topic, fromBeginning: true });
    await new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`read ${seen} of ${expected} records in ${TIMEOUT_MS} ms`)), TIMEOUT_MS);
      consumer.run({
        autoCommit: false,
        eachMessage: async ({ partition, message }) => {
          out({
            partition,
            offset: Number(message.offset),
            key: message.key === null ? null : message.key.toString(),
            value: message.value === null ? null : message.value.toString(),
          });
          next[partition] = Number(message.offset) + 1;
          seen += 1;
          if (seen >= expected) {
            clearTimeout(timer);
            resolve();
          }
        },
      }).catch(reject);
      if (expected === 0) {
        clearTimeout(timer);
        resolve();
      }
    });
    const commits = Object.entries(next).map(([partition, offset]) => ({
      topic, partition: Number(partition), offset: String(offset),
    }));
    if (commits.length) {
      await consumer.commitOffsets(commits);
    }
    out({ committed: Object.fromEntries(Object.entries(next)) });
  } finally {
    await consumer.disconnect();
  }
}

async function main() {
  const [broker, step, ...args] = process.argv.slice(2);
  const client = kafka(broker);
  switch (step) {
    case 'create': {
      const [topic, partitions, configJson] = args;
      await withAdmin(client, async (admin) => {
        const created = await admin.createTopics({
          waitForLeaders: true,
          timeout: 30000,
          topics: [{
            topic, numPartitions: Number(partitions), replicationFactor: 1,
            configEntries: entries(configJson),
          }],
        });
        out({ created });
      });
      break;
    }
    case 'alter': {
      const [topic, configJson] = args;
      await withAdmin(client, async (admin) => {
        await admin.alterConfigs({
          validateOnly: false,
          resources: [{ type: ConfigResourceTypes.TOPIC, name: topic, configEntries: entries(configJson) }],
        });
        out({ configs: await describe(admin, topic) });
      });
      break;
    }
    case 'describe': {
      const [topic] = args;
      await withAdmin(client, async (admin) => out({ configs: await describe(admin, topic) }));
      break;
    }
    case 'list-topics': {
      await withAdmin(client, async (admin) => out({ topics: (await admin.listTopics()).sort() }));
      break;
    }
    case 'produce': {
      const [topic, itemsJson] = args;
      const producer = client.producer({
        createPartitioner: Partitioners.DefaultPartitioner,
        allowAutoTopicCreation: false,
      });
      await producer.connect();
      try {
        const messages = JSON.parse(itemsJson).map(([key, value]) => ({ key, value }));
        const sent = await producer.send({ topic, acks: -1, messages });
        for (const meta of sent) {
          out({ partition: meta.partition, baseOffset: Number(meta.baseOffset), errorCode: meta.errorCode });
        }
      } finally {
        await producer.disconnect();
      }
      break;
    }
    case 'consume': {
      const [topic, group, expected] = args;
      await consume(client, topic, group, Number(expected));
      break;
    }
    case 'offsets': {
      const [topic, group] = args;
      await withAdmin(client, async (admin) => {
        const fetched = await admin.fetchOffsets({ groupId: group, topics: [topic] });
        for (const { partitions } of fetched) {
          for (const { partition, offset } of partitions) {
            out({ partition, offset: Number(offset) });
          }
        }
      });
      break;
    }
    case 'watermarks': {
      const [topic] = args;
      await withAdmin(client, async (admin) => {
        for (const { partition, low, high } of await admin.fetchTopicOffsets(topic)) {
          out({ partition, low: Number(low), high: Number(high) });
        }
      });
      break;
    }
    case 'delete-records': {
      const [topic, partition, offset] = args;
      await withAdmin(client, async (admin) => {
        // deleteTopicRecords finds the leaders in the admin's metadata: load it first.
        await admin.fetchTopicMetadata({ topics: [topic] });
        await admin.deleteTopicRecords({ topic, partitions: [{ partition: Number(partition), offset }] });
        out({ deleted: { topic, partition: Number(partition), offset: Number(offset) } });
      });
      break;
    }
    case 'delete-group': {
      const [group] = args;
      await withAdmin(client, async (admin) => {
        const deleted = await admin.deleteGroups([group]);
        out({ deleted: deleted.map(({ groupId, errorCode }) => ({ groupId, errorCode })) });
        out({ groups: (await admin.listGroups()).groups.map((g) => g.groupId).sort() });
      });
      break;
    }
    default:
      throw new Error(`unknown step ${step}`);
  }
}

main().then(
  () => process.exit(0),
  (error) => {
    process.stderr.write(`scenario failed: ${error && error.stack ? error.stack : error}\n`);
    process.exit(1);
  },
);
