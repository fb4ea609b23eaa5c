package icefloe.jvm;

import static icefloe.jvm.ProtobufPlan.*;

import java.math.BigDecimal;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF1;

/**
 * A Kafka value framed for one Protobuf message type to the table's row, or null where the Python decoder (the
 * reference) must decide: another frame, and anything the Python decoder might read otherwise or refuse (a field
 * the type does not declare, a value on an unexpected wire type, a message sent twice (merged), a string that is
 * not UTF-8, an unknown value of a closed enum, a timestamp beyond years 1 to 9999, truncation). Values follow
 * icefloe.formats.protobuf.messages' mapping.
 */
public final class ProtobufRows implements UDF1<byte[], Row> {
  private static final long serialVersionUID = 1L;
  // The years 1 and 9999 in microseconds since the epoch (Python's datetime range).
  private static final long MIN_MICROS = -62135596800000000L, MAX_MICROS = 253402300799999999L;
  private static final long MAX_SECONDS = 9_000_000_000_000L; // seconds * 1e6 stays within a long

  private final String planText;
  private transient volatile ProtobufPlan plan;

  public ProtobufRows(String planText) {
    this.planText = planText;
    this.plan = new ProtobufPlan(planText); // a bad plan fails on the driver, at registration
  }

  @Override
  public Row call(byte[] value) {
    ProtobufPlan plan = this.plan;
    if (plan == null) { // deserialized on an executor
      plan = new ProtobufPlan(planText);
      this.plan = plan;
    }
    if (value == null || value.length < plan.frame.length) {
      return null;
    }
    for (int i = 0; i < plan.frame.length; i++) {
      if (value[i] != plan.frame[i]) {
        return null;
      }
    }
    try {
      Reader reader = new Reader(value, plan.frame.length);
      return reader.message(plan.root, value.length);
    } catch (NotExact e) {
      return null;
    }
  }

  /** The record goes to Python. */
  private static final class NotExact extends Exception {
    private static final long serialVersionUID = 1L;
    static final NotExact INSTANCE = new NotExact();

    private NotExact() {
      super(null, null, false, false);
    }
  }

  private static final class Reader {
    private final byte[] data;
    private int pos;

    Reader(byte[] data, int pos) {
      this.data = data;
      this.pos = pos;
    }

    Row message(Message message, int end) throws NotExact {
      Object[] values = new Object[message.columns()];
      boolean[] seen = new boolean[message.fields.length];
      while (pos < end) {
        long tag = varint(end);
        int wire = (int) (tag & 7);
        Integer at = tag >>> 3 > Integer.MAX_VALUE ? null : message.positions.get((int) (tag >>> 3));
        if (at == null) {
          throw NotExact.INSTANCE; // a field the type does not declare (Python keeps it as unknown)
        }
        Field field = message.fields[at];
        if (field.shape == MAP) {
          entry(field, wire, values, at, end);
        } else if (field.shape == REPEATED) {
          element(field, wire, values, at, end);
        } else {
          if (wire != field.type.wireType() || field.type.wireType() == 2 && seen[at] && isMessage(field.type)) {
            throw NotExact.INSTANCE; // another wire type is an unknown field; a message sent twice is merged
          }
          values[at] = value(field.type, end);
          seen[at] = true;
          if (field.oneof >= 0) { // the member set last is the one the message holds
            for (int i = 0; i < message.fields.length; i++) {
              if (i != at && message.fields[i].oneof == field.oneof) {
                values[i] = null;
                seen[i] = false;
              }
            }
            values[message.fields.length + field.oneof] = field.name;
          }
        }
      }
      if (pos != end) {
        throw NotExact.INSTANCE;
      }
      for (int i = 0; i < message.fields.length; i++) {
        Field field = message.fields[i];
        if (field.shape == REPEATED && values[i] == null) {
          values[i] = Collections.emptyList();
        } else if (field.shape == MAP && values[i] == null) {
          values[i] = Collections.emptyMap();
        } else if (field.shape == SINGLE && !seen[i] && !field.presence) {
          values[i] = defaultOf(field.type);
        }
      }
      return RowFactory.create(values);
    }

    @SuppressWarnings("unchecked")
    private void element(Field field, int wire, Object[] values, int at, int end) throws NotExact {
      List<Object> list = (List<Object>) values[at];
      if (list == null) {
        list = new ArrayList<>();
        values[at] = list;
      }
      int elementWire = field.type.wireType();
      if (wire == 2 && elementWire != 2) { // packed scalars
        int packedEnd = length(end);
        while (pos < packedEnd) {
          list.add(value(field.type, packedEnd));
        }
      } else if (wire == elementWire) {
        list.add(value(field.type, end));
      } else {
        throw NotExact.INSTANCE;
      }
    }

    @SuppressWarnings("unchecked")
    private void entry(Field field, int wire, Object[] values, int at, int end) throws NotExact {
      if (wire != 2) {
        throw NotExact.INSTANCE;
      }
      Map<Object, Object> map = (Map<Object, Object>) values[at];
      if (map == null) {
        map = new LinkedHashMap<>();
        values[at] = map;
      }
      int entryEnd = length(end);
      Object key = null, value = null;
      while (pos < entryEnd) {
        long tag = varint(entryEnd);
        Type type = tag >>> 3 == 1 ? field.key : tag >>> 3 == 2 ? field.type : null;
        if (type == null || (int) (tag & 7) != type.wireType() || tag >>> 3 == 2 && value != null && isMessage(type)) {
          throw NotExact.INSTANCE;
        }
        if (tag >>> 3 == 1) {
          key = value(type, entryEnd);
        } else {
          value = value(type, entryEnd);
        }
      }
      if (value == null && isMessage(field.type)) {
        throw NotExact.INSTANCE; // an entry without its message value: Python's default message, not decided here
      }
      map.put(key == null ? defaultOf(field.key) : key, value == null ? defaultOf(field.type) : value);
    }

    private static boolean isMessage(Type type) {
      return type.kind >= MESSAGE;
    }

    /** One value of `type` at `pos`, its wire type checked by the caller. */
    private Object value(Type type, int end) throws NotExact {
      switch (type.kind) {
        case DOUBLE:
          return Double.longBitsToDouble(fixed64(end));
        case FLOAT:
          return Float.intBitsToFloat(fixed32(end));
        case INT32:
          return (int) varint(end);
        case INT64:
          return varint(end);
        case UINT32:
          return varint(end) & 0xFFFFFFFFL;
        case UINT64:
          return unsigned(varint(end));
        case SINT32: {
          int n = (int) varint(end);
          return (n >>> 1) ^ -(n & 1);
        }
        case SINT64: {
          long n = varint(end);
          return (n >>> 1) ^ -(n & 1);
        }
        case FIXED32:
          return fixed32(end) & 0xFFFFFFFFL;
        case FIXED64:
          return unsigned(fixed64(end));
        case SFIXED32:
          return fixed32(end);
        case SFIXED64:
          return fixed64(end);
        case BOOL:
          return varint(end) != 0;
        case STRING: {
          int stringEnd = length(end);
          int start = pos;
          pos = stringEnd;
          return utf8(start, stringEnd);
        }
        case BYTES: {
          int bytesEnd = length(end);
          int start = pos;
          pos = bytesEnd;
          return Arrays.copyOfRange(data, start, bytesEnd);
        }
        case ENUM: {
          int number = (int) varint(end);
          String name = type.enumNames.get(number);
          if (name == null && type.closed) {
            throw NotExact.INSTANCE; // Python keeps it as an unknown field
          }
          return name != null ? name : Integer.toString(number);
        }
        case MESSAGE:
          return message(type.message, length(end));
        default:
          return wellKnown(type, length(end));
      }
    }

    /** A Timestamp, a Duration or a wrapper: fields 1 and 2 of known types, nothing else. */
    private Object wellKnown(Type type, int end) throws NotExact {
      Type first = type.kind == WRAPPER ? type.wrapped : new Type(INT64);
      Object one = null;
      long two = 0;
      while (pos < end) {
        long tag = varint(end);
        if (tag == (1 << 3 | first.wireType())) {
          one = value(first, end);
        } else if (tag == (2 << 3) && type.kind != WRAPPER) {
          two = (int) varint(end); // nanos: an int32
        } else {
          throw NotExact.INSTANCE;
        }
      }
      if (pos != end) {
        throw NotExact.INSTANCE;
      }
      if (type.kind == WRAPPER) {
        return one != null ? one : defaultOf(first);
      }
      long seconds = one != null ? (Long) one : 0L;
      if (Math.abs(seconds) > MAX_SECONDS) {
        throw NotExact.INSTANCE;
      }
      if (type.kind == DURATION) {
        return seconds * 1_000_000L + two / 1000; // Python's int(nanos / 1000): toward zero
      }
      long micros = seconds * 1_000_000L + Math.floorDiv(two, 1000L); // Python's nanos // 1000
      if (micros < MIN_MICROS || micros > MAX_MICROS) {
        throw NotExact.INSTANCE; // Python's BadRecord: out of range
      }
      return Instant.ofEpochSecond(Math.floorDiv(micros, 1_000_000L), Math.floorMod(micros, 1_000_000L) * 1000L);
    }

    private long varint(int end) throws NotExact {
      long result = 0;
      for (int shift = 0; shift < 64; shift += 7) {
        if (pos >= end) {
          throw NotExact.INSTANCE;
        }
        byte b = data[pos++];
        if (shift == 63 && (b & 0xFE) != 0) {
          throw NotExact.INSTANCE; // bits beyond 64
        }
        result |= (long) (b & 0x7F) << shift;
        if (b >= 0) {
          return result;
        }
      }
      throw NotExact.INSTANCE;
    }

    private int length(int end) throws NotExact {
      long length = varint(end);
      if (length < 0 || length > end - pos) {
        throw NotExact.INSTANCE;
      }
      return pos + (int) length;
    }

    private int fixed32(int end) throws NotExact {
      if (end - pos < 4) {
        throw NotExact.INSTANCE;
      }
      int result = (data[pos] & 0xFF) | (data[pos + 1] & 0xFF) << 8 | (data[pos + 2] & 0xFF) << 16
          | (data[pos + 3] & 0xFF) << 24;
      pos += 4;
      return result;
    }

    private long fixed64(int end) throws NotExact {
      long low = fixed32(end) & 0xFFFFFFFFL;
      return low | (long) fixed32(end) << 32;
    }

    private String utf8(int start, int stringEnd) throws NotExact {
      try {
        return StandardCharsets.UTF_8.newDecoder()
            .onMalformedInput(CodingErrorAction.REPORT)
            .onUnmappableCharacter(CodingErrorAction.REPORT)
            .decode(ByteBuffer.wrap(data, start, stringEnd - start))
            .toString();
      } catch (CharacterCodingException e) {
        throw NotExact.INSTANCE; // Python refuses it, or reads it otherwise
      }
    }
  }

  private static BigDecimal unsigned(long value) {
    return value >= 0 ? BigDecimal.valueOf(value) : new BigDecimal(Long.toUnsignedString(value));
  }

  private static Object defaultOf(Type type) {
    switch (type.kind) {
      case DOUBLE:
        return 0.0d;
      case FLOAT:
        return 0.0f;
      case INT32: case SINT32: case SFIXED32:
        return 0;
      case INT64: case SINT64: case SFIXED64: case UINT32: case FIXED32:
        return 0L;
      case UINT64: case FIXED64:
        return BigDecimal.ZERO;
      case BOOL:
        return false;
      case STRING:
        return "";
      case BYTES:
        return new byte[0];
      case ENUM: {
        String name = type.enumNames.get(0);
        return name != null ? name : "0";
      }
      default:
        throw new IllegalStateException("no default for kind " + type.kind);
    }
  }
}
