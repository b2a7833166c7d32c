package io.statefleet.bench.kstreams;

import com.fasterxml.jackson.annotation.JsonIgnoreProperties;
import com.fasterxml.jackson.annotation.JsonProperty;
import com.fasterxml.jackson.annotation.JsonPropertyOrder;

/** The records of the tally workload: inputs and output as in the public contract, and the state. */
public final class Model {
    static final String ACTIVE = "active";
    static final String INACTIVE = "inactive";
    static final String DELETED = "deleted";
    static final String UNKNOWN = "unknown";

    private Model() {}

    /** A record of {@code account-events}: the fields a tally needs. */
    @JsonIgnoreProperties(ignoreUnknown = true)
    public record AccountEvent(
            @JsonProperty("account_id") String accountId,
            @JsonProperty("program_id") String programId,
            @JsonProperty("type") String type,
            @JsonProperty("version") long version) {}

    /** A record of {@code logins}. */
    @JsonIgnoreProperties(ignoreUnknown = true)
    public record Login(
            @JsonProperty("account_id") String accountId,
            @JsonProperty("program_id") String programId,
            @JsonProperty("ts") long ts) {}

    /** An account's standing in its program after the newest version applied (0: none yet). */
    public record Membership(
            @JsonProperty("program_id") String programId,
            @JsonProperty("status") String status,
            @JsonProperty("version") long version) {

        static final Membership NONE = new Membership(null, UNKNOWN, 0);

        /** The membership after {@code event}; itself when the event is not newer (a replay). */
        Membership apply(AccountEvent event) {
            if (event.version() <= version) {
                return this;
            }
            String after = switch (event.type()) {
                case "AccountCreated", "AccountReactivated" -> ACTIVE;
                case "AccountDeactivated" -> INACTIVE;
                case "AccountDeleted" -> DELETED;
                case "AccountUpdated" -> status;
                default -> null;
            };
            // An event type the tallies do not know changes nothing (statefleet dead-letters it).
            return after == null ? this : new Membership(event.programId(), after, event.version());
        }
    }

    /** A program's counts; deleted and unknown accounts count in neither. */
    public record Counts(
            @JsonProperty("active") long active,
            @JsonProperty("inactive") long inactive) {

        static final Counts ZERO = new Counts(0, 0);

        Counts plus(String status, int sign) {
            return new Counts(
                    active + (ACTIVE.equals(status) ? sign : 0),
                    inactive + (INACTIVE.equals(status) ? sign : 0));
        }
    }

    /** The joined per-program values before the key is put back in. */
    public record CountsAndLogin(Counts counts, Long lastLogin) {}

    /** The Tally JSON of {@code program-tallies}. */
    @JsonPropertyOrder({"program_id", "numberActive", "numberInactive", "lastLogin"})
    public record Tally(
            @JsonProperty("program_id") String programId,
            @JsonProperty("numberActive") long numberActive,
            @JsonProperty("numberInactive") long numberInactive,
            @JsonProperty("lastLogin") Long lastLogin) {

        static Tally of(String programId, CountsAndLogin joined) {
            Counts counts = joined.counts() == null ? Counts.ZERO : joined.counts();
            return new Tally(programId, counts.active(), counts.inactive(), joined.lastLogin());
        }
    }
}
