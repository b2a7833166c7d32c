package io.statefleet.deadletters.apps;

import java.util.concurrent.CountDownLatch;

/** The applications run until the test ends them (SIGTERM or SIGKILL). */
final class Shutdown {
    private Shutdown() {}

    /** Blocks until the JVM shuts down, running {@code stop} as it does. */
    static void awaitThen(Runnable stop) throws InterruptedException {
        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            stop.run();
            stopped.countDown();
        }));
        stopped.await();
    }
}
