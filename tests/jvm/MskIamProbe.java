// The first SASL message aws-msk-iam-auth's Java client sends to an MSK broker (args[0]): the signed JSON payload.
// Run by tests/source/test_msk_iam.py with `java -cp <the job's jars> MskIamProbe.java <broker host>`, credentials from the
// environment, so the library is exercised on the classpath the job has, without a broker.
import java.nio.charset.StandardCharsets;
import java.util.Collections;
import java.util.List;
import javax.security.auth.login.AppConfigurationEntry;
import javax.security.sasl.SaslClient;
import software.amazon.msk.auth.iam.IAMClientCallbackHandler;
import software.amazon.msk.auth.iam.IAMLoginModule;
import software.amazon.msk.auth.iam.internals.IAMSaslClient;

public class MskIamProbe {
    public static void main(String[] args) throws Exception {
        IAMClientCallbackHandler handler = new IAMClientCallbackHandler();
        AppConfigurationEntry entry = new AppConfigurationEntry(IAMLoginModule.class.getName(),
                AppConfigurationEntry.LoginModuleControlFlag.REQUIRED, Collections.emptyMap());
        handler.configure(Collections.emptyMap(), "AWS_MSK_IAM", List.of(entry));
        // The library registers its mechanism under a per-class-loader name.
        String mechanism = IAMSaslClient.getMechanismNameForClassLoader(IAMSaslClient.class.getClassLoader());
        SaslClient client = new IAMSaslClient.IAMSaslClientFactory().createSaslClient(
                new String[] {mechanism}, null, "kafka", args[0], Collections.emptyMap(), handler);
        System.out.println(new String(client.evaluateChallenge(new byte[0]), StandardCharsets.UTF_8));
    }
}
