// Package queue is Klaxon's RabbitMQ plumbing: a Consumer that hands out
// batches of deliveries and acknowledges them only when the handler says the
// work they caused is durable, and a Publisher whose Publish returns only once
// the broker has confirmed every message. Both reconnect on their own.
//
// Decisions worth knowing before changing this package:
//
//   - A handler error does not nack the batch. The Consumer keeps the same
//     batch and calls the handler again after an exponential, jittered,
//     capped backoff. Nacking would hand the messages straight back to the
//     broker, which (with prefetch) pushes them again at once: a redelivery
//     storm while, say, Redis is down, with order lost and every message
//     marked Redelivered. Holding keeps order, costs no broker round trip,
//     and the prefetch limit bounds what piles up client-side meanwhile. The
//     price: while one worker holds a batch, no other worker gets those
//     messages until this worker's channel closes (stop, crash, or the
//     broker's consumer_timeout, 30 min by default). A handler must
//     therefore return an error only for transient trouble shared by all
//     workers, and settle per-message problems itself (dead-letter, Requeue).
//
//   - Settling a batch sends one basic.ack (multiple=true) or basic.nack
//     (multiple=true, requeue=true) per run of equal outcomes, in tag order.
//     This is safe only when every tag below the batch's first is already
//     settled (tags on a channel only grow). With one batch at a time that
//     always holds. With Concurrency above 1, batches on the one channel
//     finish in any order, so only the oldest batch in flight uses multiple;
//     a younger one settles each delivery on its own, since a multiple flag
//     would also settle an older batch still in its handler. A graceful
//     stop waits for every handler before its closing multiple-nack.
//
//   - Concurrency does not raise the prefetch: the broker still sends at
//     most Prefetch deliveries ahead of acks, shared by the batches in
//     flight. What it buys is that a batch stuck in its handler (a provider
//     that hangs) holds only its own deliveries, while the other slots go
//     on handling and acking the deliveries behind it.
//
//   - A batch is what is ready when it is collected. A feeder (feeder.go)
//     reads the channel's deliveries and hands the collector all it has
//     received since the last take, in one slice: handed over one at a
//     time through a channel, only the delivery being offered at that
//     instant is visible, and without a linger a batch would close with
//     one or two while dozens wait.
//
//   - RabbitMQ has no prefetch by bytes (basic.qos prefetch-size is not
//     implemented), and amqp091 buffers whatever the broker pushes. With
//     MaxHeldBytes, the feeder counts the bytes received and not
//     settled, cancels the consumer past the budget and consumes again on
//     the same channel at half, with a prefetch sized to the messages seen,
//     starting at 1. Per-consumer qos applies to consumers started after
//     it, so a new prefetch means a new consumer: the feeder's one
//     goroutine cancels, waits for the cancelled consumer's deliveries to
//     end, and only then consumes again, so deliveries stay in tag order
//     and a multiple ack never covers one not handled. Channel flow
//     (channel.flow active=false) is not honoured by RabbitMQ, and a
//     broker max_message_size alone bounds a message, not how many.
//
//   - Each consumer connection lives in a session. A batch remembers nothing
//     but its own session's channel, so a tag is never acked on a channel
//     that did not deliver it. When a channel dies, what it delivered is
//     dropped; the broker redelivers it with Redelivered set.
//
//   - Publishing is mandatory: a message that no queue takes comes back as
//     basic.return (before its confirm), and Publish reports ErrUnroutable
//     instead of the broker dropping it silently. Each Publish call has a
//     channel to itself for its duration, so the returns and confirms seen
//     on it belong to that call alone. Queues declared through the
//     Publisher are declared again on every new connection, and again when
//     a publish to one of them comes back unroutable, so a queue deleted
//     under a running worker heals on the caller's retry.
//
//   - A message over the broker's max_message_size closes the publishing
//     channel (406 PRECONDITION_FAILED) and fails the confirms of the
//     call's messages not yet confirmed. Publish reports it as a
//     TooLargeError with the broker's limit, read from the reason: tried
//     again, the same messages fail the same way, so the caller must make
//     them smaller or set the big ones aside, not hold its batch. The
//     Consumer keeps every batch it holds (OldestHold), so that a stage
//     stuck on one can be reported.
//
//   - A consumer only looks at a queue that exists (a passive declare) and
//     declares it only when it is missing. The incoming queue belongs to its
//     producer as much as to Klaxon: Hawk's `notifier` is classic, an
//     operator may have made it quorum, and a queue's type cannot change.
//     Declaring it with Klaxon's arguments would fail with
//     PRECONDITION_FAILED on every connection for no gain. Queues Klaxon
//     owns (`.dead`, `.deliveries`, `.failed`, retry) are declared with their
//     arguments, so a mismatch is reported once with what to do. The type
//     (Type) is an argument like the others, added only for quorum: a
//     classic declaration is byte for byte what earlier versions sent.
//
//   - A consumer with an Exchange binds its queue to that consistent-hash
//     exchange (x-consistent-hash, weight 1) on every connection, after
//     declaring both if missing: binding is tied to consuming, so a queue
//     deleted under a running worker comes back bound, and the exchange
//     spreads messages only over queues some worker has consumed. The
//     exchange type is a plugin RabbitMQ ships disabled; without it the
//     broker closes the connection with COMMAND_INVALID, reported as
//     ErrNoHashExchange with the command that enables it.
//
// Credentials never reach the logs: URLs are logged without their user info
// (scheme, host and vhost only), and an unparsable URL is reported without
// its text.
package queue
