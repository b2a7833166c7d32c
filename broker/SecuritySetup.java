// Applies SCRAM users and ACLs to the secure broker through Kafka's Admin API (aiokafka's
// CreateAcls is older than any version Kafka 4 accepts). Run by tools/kafka_broker.py in
// Java's source-file mode, with the broker's jars on the class path:
//
//   java -cp 'libs/*' SecuritySetup.java <admin client properties> <spec file>
//
// Spec lines: "user <name> <password>" (SCRAM-SHA-512, created or updated) and
// "acl <principal> <resource type> <pattern type> <resource name> <operation>" (ALLOW, any host).
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ScramCredentialInfo;
import org.apache.kafka.clients.admin.ScramMechanism;
import org.apache.kafka.clients.admin.UserScramCredentialAlteration;
import org.apache.kafka.clients.admin.UserScramCredentialUpsertion;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourceType;

public class SecuritySetup {
    public static void main(String[] args) throws Exception {
        Properties config = new Properties();
        try (var in = Files.newInputStream(Path.of(args[0]))) {
            config.load(in);
        }
        List<UserScramCredentialAlteration> users = new ArrayList<>();
        List<AclBinding> acls = new ArrayList<>();
        for (String line : Files.readAllLines(Path.of(args[1]))) {
            String[] f = line.trim().split("\\s+");
            if (f[0].isEmpty() || f[0].startsWith("#")) {
                continue;
            }
            switch (f[0]) {
                case "user" -> users.add(new UserScramCredentialUpsertion(
                        f[1], new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), f[2]));
                case "acl" -> acls.add(new AclBinding(
                        new ResourcePattern(ResourceType.valueOf(f[2]), f[4], PatternType.valueOf(f[3])),
                        new AccessControlEntry(f[1], "*", AclOperation.valueOf(f[5]), AclPermissionType.ALLOW)));
                default -> throw new IllegalArgumentException("unknown spec line: " + line);
            }
        }
        try (Admin admin = Admin.create(config)) {
            if (!users.isEmpty()) {
                admin.alterUserScramCredentials(users).all().get();
            }
            if (!acls.isEmpty()) {
                admin.createAcls(acls).all().get();
            }
        }
        System.out.println("applied " + users.size() + " users and " + acls.size() + " ACLs");
    }
}
