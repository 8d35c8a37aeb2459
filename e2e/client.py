"""The e2e journey's Kafka client, run in a pod of the Shale image (kafka-python is one of its dependencies).

Produces UPDATES values for each of KEYS keys into TOPIC through BOOTSTRAP (the chart's client Service),
then reads the topic from the beginning and checks that the last value read for every key is the last
one written. Prints one JSON line with the counts; exits 1 if a key's latest value is wrong or missing.
"""

import json
import os
import sys

from kafka import KafkaConsumer, KafkaProducer

bootstrap = os.environ["BOOTSTRAP"]
topic = os.environ.get("TOPIC", "e2e-prices")
keys, updates = int(os.environ.get("KEYS", "10")), int(os.environ.get("UPDATES", "10"))

producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", retries=5)
expected = {}
for round_ in range(updates):
    for k in range(keys):
        key, value = f"product-{k}", f"price-{round_}"
        producer.send(topic, key=key.encode(), value=value.encode())
        expected[key] = value
producer.flush(60)
producer.close()

consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                         enable_auto_commit=False, consumer_timeout_ms=10000)
latest, records = {}, 0
for record in consumer:
    latest[record.key.decode()] = record.value.decode()
    records += 1
consumer.close()

wrong = {k: latest.get(k) for k, v in expected.items() if latest.get(k) != v}
print(json.dumps({"produced": keys * updates, "consumed": records, "keys": len(latest), "wrong": wrong}))
sys.exit(1 if wrong else 0)
