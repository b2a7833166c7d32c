# The Java client of the dead-letter protocol (clients/java: DeadLetters, the Spring Kafka
# recoverer, their JUnit tests) and the applications the e2e tests run with it (a Spring Kafka
# listener, a Kafka Connect sink, a Kafka Streams application: clients/java/test-apps). Built
# once per machine and content of the sources into $(STATEFLEET_CACHE), the JUnit tests with
# them, and linked into .local/java-clients, where tests/e2e/retry_scheduler/test_java_clients.py
# finds the applications' jar and its lib/.

JAVA_CLIENTS_SRC := clients/java
JAVA_CLIENTS_SOURCES := $(sort $(shell find $(JAVA_CLIENTS_SRC) -type f \( -name pom.xml -o -path '*/src/*' \) -not -path '*/target/*' 2>/dev/null))
JAVA_CLIENTS_DIGEST := $(shell sha256sum $(JAVA_CLIENTS_SOURCES) | sha256sum | cut -c1-16)
JAVA_CLIENTS_CACHE := $(STATEFLEET_CACHE)/java/clients-$(JAVA_CLIENTS_DIGEST)
JAVA_CLIENTS_JAR := $(JAVA_CLIENTS_CACHE)/statefleet-test-apps/statefleet-test-apps.jar
JAVA_CLIENTS_LINK := $(CURDIR)/.local/java-clients

$(JAVA_CLIENTS_JAR):
	@$(call cached-maven-build,$(JAVA_CLIENTS_SRC)/pom.xml,$(JAVA_CLIENTS_CACHE),statefleet.build.dir,the Java dead-letter client and its test applications)

.PHONY: java-clients-build
java-clients-build: $(JAVA_CLIENTS_JAR) ## Build the Java dead-letter client and its e2e applications (once per machine)
	@mkdir -p $(dir $(JAVA_CLIENTS_LINK))
	@rm -rf $(JAVA_CLIENTS_LINK)
	@ln -sfn $(JAVA_CLIENTS_CACHE)/statefleet-test-apps $(JAVA_CLIENTS_LINK)

# The client's JUnit tests alone, in .local/ (seconds once Maven has the jars).
.PHONY: java-clients-test
java-clients-test: ## The Java dead-letter client's JUnit tests
	mvn -q -B -f $(JAVA_CLIENTS_SRC)/pom.xml -pl dead-letters test -Dstatefleet.build.dir=$(CURDIR)/.local/java-build

test-integration: java-clients-build
test-ready:: java-clients-build
